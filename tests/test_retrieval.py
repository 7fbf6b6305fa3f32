"""The three-head retrieval graph: each head against FlagEmbedding's BGE-M3 code and the project's
reference, the max reduction, padded batches, the published directory, its manifest and the verification
command; a wrong head makes FlagEmbedding's comparison fail."""

import dataclasses
import inspect
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from conftest import cli_runner
from encoder_study.core import files, tables
from encoder_study.encoders import reference
from encoder_study.onnx import runtime
from encoder_study.onnx.manifest import CONFIG_FILE, ONNX_FILE, TOKENIZER_FILE
from encoder_study.recipes.retrieval import OUTPUTS, RetrievalError, check, flagembedding, graph
from encoder_study.recipes.retrieval import export as retrieval
from encoder_study.recipes.retrieval.cases import max_length, parity_cases
from encoder_study.recipes.retrieval.heads import (
    COLBERT_FILE,
    HEAD_FILES,
    SPARSE_FILE,
    ignored_ids,
    load_heads,
    random_heads,
    save_heads,
)
from encoder_study.recipes.retrieval.verify import verify

# What the rules pass from the config (config/config.yaml's retrieval section).
SETTINGS = retrieval.Settings(opset=18, tolerance=1e-4, threads=1, ort_optimization="basic",
                              external_data="auto")


command = cli_runner("retrieval")


@pytest.fixture(scope="module")
def built(tiny_exports, models_dir, tmp_path_factory):
    """xlmr-tiny with random heads, made and exported by the commands the workflow runs (with SETTINGS);
    "returned": what retrieval.export_graph returned to the export command."""
    source = models_dir / "sources" / "xlmr-tiny" / "source.json"
    base = tmp_path_factory.mktemp("retrieval")
    prov = base / "provenance" / "retrieval"
    assert command("heads", "--source", str(source), "--seed", "0", "--out-dir", str(base / "heads"),
                   "--provenance", str(prov / "retrieval_heads.md")) == 0
    real, returned = retrieval.export_graph, []

    def export_graph(*args, **kwargs):
        returned.append(real(*args, **kwargs))
        return returned[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retrieval, "export_graph", export_graph)
        assert command(
            "export", "--source", str(source), "--heads-dir", str(base / "heads"),
            "--out-dir", str(base / "model"),
            "--parity", str(base / "parity.csv"), "--markdown", str(base / "parity.md"),
            "--opset", "18", "--tolerance", "1e-4", "--ort-optimization", "basic", "--external-data", "auto",
            "--sparse-top-k", "0",
            "--threads", "1", "--provenance", str(prov / "retrieval_export.md")) == 0
    (exported,) = returned
    return {"base": base, "source": source, "model": base / "model", "heads": base / "heads",
            "returned": exported}


@pytest.fixture(scope="module")
def parts(built):
    """The encoder, heads and ignored ids the graph was made from, and a session on the published graph."""
    model_dir = built["source"].parent / "model"
    encoder = reference.load_pytorch(model_dir)
    heads = load_heads(built["heads"], encoder.config.hidden_size)
    roles = ignored_ids(model_dir, encoder.config)
    session = runtime.ort_session(built["model"] / ONNX_FILE, 1)

    def run(ids, mask):
        got = session.run(list(OUTPUTS), {"input_ids": ids, "attention_mask": mask})
        return dict(zip(OUTPUTS, got, strict=True))

    return {"encoder": encoder, "heads": heads, "ignored": list(roles.values()), "roles": roles, "run": run,
            "model_dir": model_dir}


def _cases(parts):
    return parity_cases(parts["model_dir"] / "tokenizer.json", parts["encoder"].config)


def _case(parts, name):
    return next(c for c in _cases(parts) if c.name == name)


def test_graph_contract(built):
    model = onnx.load(str(built["model"] / ONNX_FILE))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18)]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    shapes = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
              for o in model.graph.output}
    vocab = json.loads((built["model"] / CONFIG_FILE).read_text())["vocab_size"]
    assert shapes == {"dense": ["batch", 16], "sparse": ["batch", vocab],
                      "colbert": ["batch", "sequence", 16]}
    (scatter,) = [n for n in model.graph.node if n.op_type == "ScatterElements"]
    assert {a.name: a.s for a in scatter.attribute}["reduction"] == b"max"
    assert not [n for n in model.graph.node if n.op_type == "If"]  # the stock symbolic's rank-0 branches


def test_graph_attends_one_head_at_a_time(built):
    """Each softmax holds one head's scores ([batch, 1, sequence, sequence]): an 8,192-piece input then
    needs 1/16 of the memory BGE-M3's 16 heads would need at once."""
    model = onnx.load(str(built["model"] / ONNX_FILE))
    config = json.loads((built["model"] / CONFIG_FILE).read_text())
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == config["num_hidden_layers"] * config["num_attention_heads"] == 4
    # Their inputs' shapes, by running the graph with them as outputs.
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None)
                              for n in softmaxes)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids, mask = runtime.pad_batch([[0, 5, 6, 7, 2], [0, 8, 2]], 1)
    scores = session.run([n.input[0] for n in softmaxes], {"input_ids": ids, "attention_mask": mask})
    assert [s.shape for s in scores] == [(2, 1, 5, 5)] * 4


def test_per_head_attention_is_eager_attention_and_the_reference_is_sdpa(parts):
    encoder = parts["encoder"]
    batch = _case(parts, "batch")
    ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
    with torch.no_grad():
        eager = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        with graph.attention(encoder, graph.PER_HEAD_ATTENTION):
            per_head = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        calls = []
        with pytest.MonkeyPatch.context() as patch:  # the reference's encoder runs PyTorch's fused kernel
            sdpa = torch.nn.functional.scaled_dot_product_attention
            patch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                          lambda *a, **k: calls.append(1) or sdpa(*a, **k))
            want = check.reference(encoder, parts["heads"], parts["ignored"], batch.input_ids,
                                   batch.attention_mask)
    assert encoder.config._attn_implementation == "eager"  # each block restores the model's own
    assert len(calls) == encoder.config.num_hidden_layers
    torch.testing.assert_close(per_head, eager, rtol=0, atol=1e-6)
    assert not torch.equal(per_head, torch.zeros_like(per_head))
    dense = eager[:, 0].double() / eager[:, 0].double().norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(want["dense"], dense.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("output", OUTPUTS)
def test_each_head_matches_the_reference_on_unseen_shapes(parts, output):
    rng = np.random.default_rng(3)
    vocab = parts["encoder"].config.vocab_size
    lengths = [57, 4, 30]
    ids = np.full((3, 57), 1, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = [0, *rng.integers(4, vocab - 1, n - 2), 2]
        mask[row, :n] = 1
    got = parts["run"](ids, mask)[output]
    want = check.reference(parts["encoder"], parts["heads"], parts["ignored"], ids, mask)[output]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_max_reduction_keeps_the_largest_weight_of_repeated_pieces(parts):
    case = _case(parts, "repeated")
    ids, mask = case.input_ids, case.attention_mask
    with torch.no_grad():
        hidden = parts["encoder"](input_ids=torch.from_numpy(ids),
                                  attention_mask=torch.from_numpy(mask)).last_hidden_state
        weights = torch.relu(parts["heads"].sparse(hidden))[0, :, 0].numpy()
    sparse = parts["run"](ids, mask)["sparse"][0]
    repeated = [t for t in set(ids[0].tolist()) if t not in parts["ignored"] and (ids[0] == t).sum() > 1]
    distinct, inside = 0, 0
    for token in repeated:
        at = weights[ids[0] == token]
        assert sparse[token] == pytest.approx(at.max(), abs=1e-5)
        if (at > 0).sum() > 1 and at.max() - at.min() > 1e-3:
            distinct += 1
            assert sparse[token] < at.sum() - 1e-4  # not summed
            # Neither the first nor the last occurrence: a scatter without reduction keeps one of those.
            inside += abs(at.max() - at[0]) > 1e-3 and abs(at.max() - at[-1]) > 1e-3
    assert distinct >= 2 and inside >= 1, "the repeated case should give pieces whose weights differ"
    assert np.all(sparse[parts["ignored"]] == 0)  # <s>, </s>, <pad>, <unk> contribute nothing
    assert np.count_nonzero(sparse) == np.count_nonzero(
        [weights[ids[0] == t].max() for t in set(ids[0].tolist()) if t not in parts["ignored"]])


def test_unknown_pieces_contribute_nothing(parts):
    case = _case(parts, "unknown")
    unk = parts["roles"]["unk"]
    assert unk in case.input_ids[0]
    assert parts["run"](case.input_ids, case.attention_mask)["sparse"][0, unk] == 0


def test_padded_batch_rows_match_each_text_alone(parts):
    batch = _case(parts, "batch")
    together = parts["run"](batch.input_ids, batch.attention_mask)
    for row, n in enumerate(batch.attention_mask.sum(axis=1)):
        ids, mask = batch.input_ids[row : row + 1, :n], batch.attention_mask[row : row + 1, :n]
        alone = parts["run"](ids, mask)
        np.testing.assert_allclose(together["dense"][row], alone["dense"][0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(together["sparse"][row], alone["sparse"][0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(together["colbert"][row, :n], alone["colbert"][0], rtol=0, atol=1e-5)
        assert np.all(together["colbert"][row, n:] == 0)  # padding positions are masked
        # The first position is kept: as many unit vectors as the mask has ones.
        np.testing.assert_allclose(np.linalg.norm(alone["colbert"][0], axis=-1), 1.0, atol=1e-5)
    assert together["colbert"].shape[:2] == batch.attention_mask.shape


def test_parity_table_and_provenance(built):
    rows = tables.read_csv(built["base"] / "parity.csv")
    assert list(rows[0]) == check.PARITY_COLUMNS
    cases = {r["case"] for r in rows}
    assert len(cases) >= 8 and {"english", "short", "long", "multilingual", "repeated", "padding_tail",
                                "batch"} <= cases
    assert all(r["allclose"] == "True" for r in rows) and len(rows) == 2 * 3 * len(cases)
    assert {(r["case"], r["output"], r["reference"]) for r in rows} == {
        (c, o, ref) for c in cases for o in OUTPUTS for ref in (flagembedding.NAME, check.PROJECT)}
    assert max(float(r["max_abs"]) for r in rows if r["reference"] == flagembedding.NAME) <= 1e-5
    long = next(r for r in rows if r["case"] == "long")
    assert int(long["tokens"]) == 128  # xlmr-tiny's 130 positions less padding_idx + 1
    # The first ColBERT vector is only the project's to compare: FlagEmbedding drops it.
    empty = {r["reference"]: float(r["max_value"]) for r in rows
             if (r["case"], r["output"]) == ("empty", "colbert")}
    assert empty[flagembedding.NAME] != empty[check.PROJECT]
    parity_md = (built["base"] / "parity.md").read_text()
    assert "| batch | colbert | flagembedding |" in parity_md
    assert "`colbert_linear(hidden[:, 1:])`" in parity_md  # the notes under the table
    fragment = (built["base"] / "provenance/retrieval/retrieval_export.md").read_text()
    assert "keeps the first position" in fragment and "| long | sparse | project |" in fragment
    assert "FlagEmbedding==1.4.2, class M3Embedder" in fragment
    size = sum(p.stat().st_size for p in built["model"].iterdir()
               if p.name in (ONNX_FILE, retrieval.DATA_FILE))
    assert f"x the graph's {size:,} bytes" in fragment and "peak memory of the export:" in fragment
    assert "| check the graph in ONNX Runtime, case by case |" in fragment


def test_memory_of_each_phase(built):
    record, rows, memory = built["returned"]
    assert [p["phase"] for p in memory.phases] == [
        "FlagEmbedding's outputs for every case",
        "load the PyTorch model; the project's reference of every case",
        "export to ONNX (TorchScript tracer)", "optimise, check and save the graph",
        "check the graph in ONNX Runtime, case by case"]
    assert memory.reset  # Linux: each phase's peak is its own
    assert all(p["peak_mib"] >= p["resident_before_mib"] > 0 for p in memory.phases)
    assert memory.model_bytes == (built["model"] / ONNX_FILE).stat().st_size
    assert memory.peak["peak_mib"] == max(p["peak_mib"] for p in memory.phases)
    ratio = memory.peak["peak_mib"] * 2**20 / memory.model_bytes
    assert f"{ratio:.2f} x the graph's {memory.model_bytes:,} bytes" in memory.note()
    assert "peak (MiB)" in memory.markdown() and "memory" not in record  # the manifest stays reproducible


def test_manifest_lists_every_published_file(built):
    record = json.loads((built["model"] / retrieval.MANIFEST).read_text())
    listed = {e["path"] for e in record["files"]}
    assert listed == {p.name for p in built["model"].iterdir()} - {retrieval.MANIFEST}
    assert record["heads_semantics"]["sparse_ignored_ids"] == {"cls": 0, "eos": 2, "pad": 1, "unk": 3}
    assert record["exporter"]["opset"] == 18 and record["optimization"]["offline"] == "basic"
    references = record["check"]["references"]
    assert references[flagembedding.NAME]["package"] == "FlagEmbedding==1.4.2"
    assert references[flagembedding.NAME]["settings"]["use_fp16"] is False
    assert record["libraries"]["FlagEmbedding"] == "1.4.2"
    assert set(record["check"]["max_abs"]) == {flagembedding.NAME, check.PROJECT}
    assert not list(built["base"].glob(".*.tmp"))  # no staging directory left behind
    assert verify(built["model"], retrieval.MANIFEST) == []


def test_verify_names_each_changed_and_missing_file(built, tmp_path, capsys):
    copy = tmp_path / "model"
    shutil.copytree(built["model"], copy)
    args = ["verify", str(copy), "--manifest", retrieval.MANIFEST, "--provenance", str(tmp_path / "v.md")]
    assert command(*args) == 0
    assert "| " + str(copy) + " | " in (tmp_path / "v.md").read_text()
    (tmp_path / "v.md").unlink()
    expected = files.sha256_file(copy / TOKENIZER_FILE)
    with open(copy / TOKENIZER_FILE, "a") as handle:
        handle.write(" ")
    (copy / ONNX_FILE).unlink()
    capsys.readouterr()
    assert command(*args) == 1
    assert not (tmp_path / "v.md").exists()  # no fragment unless every file matches
    err = capsys.readouterr().err
    assert f"{copy / ONNX_FILE} is missing" in err
    assert f"{copy / TOKENIZER_FILE} changed" in err and expected in err


def test_external_data_graph_is_published_whole(built, tmp_path):
    out = tmp_path / "external"
    settings = dataclasses.replace(SETTINGS, external_data="always")
    record, rows, memory = retrieval.export_graph(built["source"], built["heads"], out, settings)
    assert {e["path"] for e in record["files"]} >= {ONNX_FILE, retrieval.DATA_FILE}
    assert (out / ONNX_FILE).stat().st_size < (out / retrieval.DATA_FILE).stat().st_size
    assert all(r["allclose"] for r in rows) and verify(out, retrieval.MANIFEST) == []
    (out / retrieval.DATA_FILE).unlink()
    assert [p for p in verify(out, retrieval.MANIFEST) if retrieval.DATA_FILE in p]


def test_the_compact_sparse_output_is_the_rows_top_k_in_the_same_graph(built, tmp_path):
    out = tmp_path / "compact"
    record, rows, _ = retrieval.export_graph(built["source"], built["heads"], out,
                                             dataclasses.replace(SETTINGS, sparse_top_k=5))
    assert record["compact_sparse"]["top_k"] == 5 and all(r["allclose"] for r in rows)
    assert record["exporter"]["outputs"]["sparse_top_ids"] == {"dtype": "int64", "shape": ["batch", 5]}
    session = onnxruntime.InferenceSession(str(out / ONNX_FILE), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == [*OUTPUTS, *graph.COMPACT_OUTPUTS]
    case = next(c for c in parity_cases(out / TOKENIZER_FILE, reference.load_pytorch(
        reference.source_dir(built["source"])[0]).config) if c.name == "batch")
    sparse, ids, weights = session.run(["sparse", *graph.COMPACT_OUTPUTS],
                                       {"input_ids": case.input_ids, "attention_mask": case.attention_mask})
    for row in range(sparse.shape[0]):
        top = sorted(sparse[row][sparse[row] > 0], reverse=True)[:5]
        assert weights[row].tolist() == pytest.approx(top + [0.0] * (5 - len(top)), abs=0)
        assert sparse[row, ids[row]].tolist() == weights[row].tolist()
    # The default graph has the seed's three outputs, and its manifest says nothing of a compact one.
    assert "compact_sparse" not in built["returned"][0]
    default = onnx.load(str(built["model"] / ONNX_FILE), load_external_data=False)
    assert [o.name for o in default.graph.output] == list(OUTPUTS)


def test_a_failed_check_publishes_nothing(built, tmp_path):
    out = tmp_path / "strict" / "model"
    with pytest.raises(RetrievalError, match="nothing was written"):
        retrieval.export_graph(built["source"], built["heads"], out,
                               dataclasses.replace(SETTINGS, tolerance=1e-30))
    assert list((tmp_path / "strict").iterdir()) == []


def test_opset_without_max_scatter_is_refused(built, tmp_path):
    with pytest.raises(RetrievalError, match="opset 18"):
        retrieval.export_graph(built["source"], built["heads"], tmp_path / "m",
                               dataclasses.replace(SETTINGS, opset=17))


def test_heads_are_reproducible_and_read_like_flagembedding_files(built, tmp_path):
    again = save_heads(random_heads(16, 0), tmp_path / "again")
    for path in again:
        assert files.sha256_file(path) == files.sha256_file(built["heads"] / path.name)
    # BGE-M3 ships fp16 state dicts; the sparse head has one output.
    half = {name: {k: v.half() for k, v in state.items()} for name, state in random_heads(16, 1).items()}
    save_heads(half, tmp_path / "half")
    heads = load_heads(tmp_path / "half", 16)
    assert heads.sparse.weight.dtype == torch.float32 and tuple(heads.sparse.weight.shape) == (1, 16)
    with pytest.raises(RetrievalError, match=r"colbert_linear\.pt.*expected weight \[dim, 24\]"):
        load_heads(tmp_path / "half", 24)
    two = dict(half, **{SPARSE_FILE: {"weight": torch.zeros(2, 16), "bias": torch.zeros(2)}})
    save_heads(two, tmp_path / "two")
    with pytest.raises(RetrievalError, match=r"sparse_linear\.pt.*expected weight \[1, 16\]"):
        load_heads(tmp_path / "two", 16)


# --- FlagEmbedding as the reference ---------------------------------------------------------------

def test_the_reference_is_flagembeddings_own_installed_code():
    """The class and the modules computing the heads are the installed package's files, unchanged."""
    from importlib import metadata

    embedder = flagembedding.embedder_class()
    root = Path(metadata.distribution("FlagEmbedding").locate_file("FlagEmbedding"))
    assert embedder.__name__ == "M3Embedder" and metadata.version("FlagEmbedding") == "1.4.2"
    heads_module = sys.modules["FlagEmbedding.finetune.embedder.encoder_only.m3.modeling"]
    for source in (inspect.getsourcefile(embedder), heads_module.__file__):
        path = Path(source)
        assert path.is_relative_to(root)
        recorded = next(f for f in metadata.distribution("FlagEmbedding").files
                        if Path(metadata.distribution("FlagEmbedding").locate_file(f)) == path)
        assert files.sha256_file(path) == _record_hash(recorded)  # as the wheel installed it
    # The class FlagEmbedding exports as BGEM3FlagModel.
    init = (root / "inference/embedder/encoder_only/__init__.py").read_text()
    assert "from .m3 import M3Embedder as BGEM3FlagModel" in init


def _record_hash(entry) -> str:
    """The hex SHA-256 of an installed file from the wheel's RECORD (urlsafe base64, unpadded)."""
    import base64

    assert entry.hash.mode == "sha256"
    return base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()


def _flagembedding_rows(parts, heads_dir: Path) -> list[dict]:
    """The parity rows of the published graph against FlagEmbedding reading the heads in `heads_dir`."""
    config = parts["encoder"].config
    heads = {"colbert": heads_dir / COLBERT_FILE, "sparse": heads_dir / SPARSE_FILE}
    cases = [c for c in _cases(parts) if c.name in ("english", "batch")]
    theirs = flagembedding.reference(parts["model_dir"], heads, parts["roles"], cases, max_length(config),
                                     config.vocab_size)
    rows = []
    for case, want in zip(cases, theirs, strict=True):
        got = flagembedding.graph_view(parts["run"](case.input_ids, case.attention_mask), case.attention_mask)
        rows += check.compare(case, flagembedding.NAME, got, want, 1e-4)
    return rows


def test_flagembedding_agrees_with_the_graph_on_its_heads(built, parts):
    rows = _flagembedding_rows(parts, built["heads"])
    assert all(r["allclose"] for r in rows) and max(r["max_abs"] for r in rows) <= 1e-5


@pytest.mark.parametrize("wrong, fails", [
    ("sparse weight", {"sparse"}), ("colbert bias", {"colbert"}),
    ("heads of another seed", {"sparse", "colbert"}),
])
def test_a_wrong_head_fails_the_comparison_with_flagembedding(built, parts, tmp_path, wrong, fails):
    state = {name: torch.load(built["heads"] / name, weights_only=True) for name in HEAD_FILES}
    if wrong == "sparse weight":
        state[SPARSE_FILE]["weight"][0, 3] += 0.05
    elif wrong == "colbert bias":
        state[COLBERT_FILE]["bias"][5] += 0.05
    else:
        state = random_heads(16, 1)
    save_heads(state, tmp_path / "wrong")
    rows = _flagembedding_rows(parts, tmp_path / "wrong")
    assert {r["output"] for r in rows if not r["allclose"]} == fails


def test_the_export_publishes_nothing_when_flagembedding_disagrees(built, tmp_path, monkeypatch):
    """FlagEmbedding given other heads than the graph (a perturbed sparse weight): the export fails."""
    state = {name: torch.load(built["heads"] / name, weights_only=True) for name in HEAD_FILES}
    state[SPARSE_FILE]["weight"][0, 0] += 0.05
    wrong = dict(zip(("colbert", "sparse"), save_heads(state, tmp_path / "wrong"), strict=True))
    real = flagembedding.reference
    monkeypatch.setattr(flagembedding, "reference",
                        lambda model_dir, heads, *rest: real(model_dir, wrong, *rest))
    out = tmp_path / "out" / "model"
    with pytest.raises(RetrievalError, match=r"differs from its references.*nothing was written") as caught:
        retrieval.export_graph(built["source"], built["heads"], out, SETTINGS)
    assert "| sparse | flagembedding |" in str(caught.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_head_is_refused_where_flagembedding_would_draw_one(parts, tmp_path):
    shutil.copytree(parts["model_dir"], tmp_path / "m")
    save_heads({k: v for k, v in random_heads(16, 0).items() if k == COLBERT_FILE}, tmp_path / "m")
    with pytest.raises(RetrievalError, match="no sparse_linear.pt; FlagEmbedding would draw"):
        flagembedding.load(tmp_path / "m", 128)


def test_flagembedding_reads_the_models_tokenizer_as_it_is(parts, tmp_path):
    """transformers 5's XLMRobertaTokenizer rebuilds the tokenizer and drops the tiny model's NFKC
    normaliser: the pieces of the Thai text differ, and the check says so. The tokenizer_config.json
    the reference writes has transformers read tokenizer.json as it is."""
    from transformers import AutoTokenizer

    multilingual = _case(parts, "multilingual")
    thai = multilingual.texts.index(next(t for t in multilingual.texts if "ภาษาไทย" in t))
    ours = multilingual.input_ids[thai][multilingual.attention_mask[thai] == 1].tolist()
    assert AutoTokenizer.from_pretrained(parts["model_dir"])(multilingual.texts[thai])["input_ids"] != ours
    heads = {"colbert": tmp_path / COLBERT_FILE, "sparse": tmp_path / SPARSE_FILE}
    save_heads(random_heads(16, 0), tmp_path)
    with flagembedding.model_directory(parts["model_dir"], heads, parts["roles"]) as directory:
        config = json.loads((directory / flagembedding.TOKENIZER_CONFIG).read_text())
        assert config["tokenizer_class"] == "TokenizersBackend"
        assert (config["cls_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
            "<s>", "</s>", "<pad>", "<unk>")
        assert AutoTokenizer.from_pretrained(directory)(multilingual.texts[thai])["input_ids"] == ours
        rebuilt = {"tokenizer_class": "XLMRobertaTokenizer"}
        (directory / flagembedding.TOKENIZER_CONFIG).write_text(json.dumps(rebuilt))
        embedder = flagembedding.load(directory, 128)
        with pytest.raises(RetrievalError, match=f"case multilingual, text {thai}: FlagEmbedding's tok"):
            flagembedding.outputs(embedder, multilingual, 128, parts["encoder"].config.vocab_size)


# -- the int8 variant (issue 35) ------------------------------------------------------------------------

GATE = {"min-dense-cosine": "0.99", "min-sparse-top10": "0.8", "min-sparse-correlation": "0.95",
        "min-colbert-cosine": "0.9", "min-colbert-cosine-p5": "0.95"}


def _quantise(built, out: Path, capsys, **gate) -> tuple[int, list[str]]:
    options = [x for k, v in {**GATE, **gate}.items() for x in (f"--quantisation-{k}", v)]
    status = command("quantisation", "--model-dir", str(built["model"]), "--source", str(built["source"]),
                     "--heads-dir", str(built["heads"]), "--quantisation-per-channel",
                     "--quantisation-embeddings", *options, "--threads", "1", "--out-dir", str(out / "int8"),
                     "--out", str(out / "quantisation.csv"),
                     "--provenance", str(out / "prov" / "retrieval_quantisation.md"))
    return status, capsys.readouterr().out.splitlines()


def test_the_int8_variant_is_published_with_its_manifest_and_refused_when_damaged(built, tmp_path, capsys):
    status, said = _quantise(built, tmp_path, capsys)
    assert status == 0 and said == [f"retrieval int8 variant published in {tmp_path / 'int8'}"]
    folder = tmp_path / "int8"
    assert verify(folder, retrieval.MANIFEST) == []
    manifest = json.loads((folder / retrieval.MANIFEST).read_text(encoding="utf-8"))
    listed = {e["path"]: e["sha256"] for e in manifest["files"]}
    assert listed[ONNX_FILE] == manifest["variant"]["quantisation"]["sha256"]
    assert listed[ONNX_FILE] == files.sha256_file(folder / ONNX_FILE)
    assert manifest["optimization"]["external_data"] is False
    assert not (folder / (ONNX_FILE + ".data")).exists()
    ops = {n.op_type for n in onnx.load(str(folder / ONNX_FILE)).graph.node}
    assert {"MatMulInteger", "DequantizeLinear"} <= ops
    rows = tables.read_csv(tmp_path / "quantisation.csv")
    cases = built["returned"][0]["check"]["cases"]
    assert len(rows) == 2 * len(cases) and {r["reference"] for r in rows} == {"float32", "flagembedding"}
    # The fragment lists the variant's files with their SHA-256 (what the run crate lists).
    from encoder_study.provenance import twin
    from encoder_study.provenance.records import read_record

    record = read_record(twin(tmp_path / "prov" / "retrieval_quantisation.md"))
    outputs = {Path(f["path"]).name: f["sha256"] for f in record["files"] if f["role"] == "output"
               and Path(f["path"]).parent.name == "int8"}
    assert outputs[ONNX_FILE] == listed[ONNX_FILE] and retrieval.MANIFEST in outputs
    # A damaged int8 graph is refused like any export's, naming the file.
    data = bytearray((folder / ONNX_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / ONNX_FILE).write_bytes(bytes(data))
    (problem,) = verify(folder, retrieval.MANIFEST)
    assert f"{folder / ONNX_FILE} changed" in problem


def test_an_int8_variant_over_a_threshold_is_refused_in_one_line(built, tmp_path, capsys):
    status, said = _quantise(built, tmp_path, capsys, **{"min-dense-cosine": "1.01"})
    assert status == 0 and len(said) == 1
    assert said[0].startswith("retrieval int8 variant not published: case english against float32: "
                              "dense_cos_min") and "min_dense_cosine 1.01" in said[0]
    assert not any((tmp_path / "int8").iterdir())
    assert {r["published"] for r in tables.read_csv(tmp_path / "quantisation.csv")} == {"False"}

