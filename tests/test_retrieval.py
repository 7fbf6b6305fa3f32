"""The three-head retrieval graph: each head against the reference, the max reduction, padded batches,
the published directory, its manifest and the verification command."""

import dataclasses
import json
import shutil

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from conftest import cli_runner
from encoder_study import files, reference, retrieval, runtime, tables

# What the rules pass from the config (config/config.yaml's retrieval section).
SETTINGS = retrieval.Settings(opset=18, tolerance=1e-4, threads=1, ort_optimization="basic",
                              external_data="auto")


command = cli_runner("retrieval")


@pytest.fixture(scope="module")
def built(tiny_exports, models_dir, tmp_path_factory):
    """xlmr-tiny with random heads, made and exported by the commands the workflow runs."""
    source = models_dir / "sources" / "xlmr-tiny" / "source.json"
    base = tmp_path_factory.mktemp("retrieval")
    prov = base / "provenance" / "retrieval"
    assert command("heads", "--source", str(source), "--seed", "0", "--out-dir", str(base / "heads"),
                   "--provenance", str(prov / "retrieval_heads.md")) == 0
    assert command(
        "export", "--source", str(source), "--heads-dir", str(base / "heads"),
        "--out-dir", str(base / "model"),
        "--parity", str(base / "parity.csv"), "--markdown", str(base / "parity.md"),
        "--opset", "18", "--tolerance", "1e-4", "--ort-optimization", "basic", "--external-data", "auto",
        "--threads", "1", "--provenance", str(prov / "retrieval_export.md")) == 0
    return {"base": base, "source": source, "model": base / "model", "heads": base / "heads"}


@pytest.fixture(scope="module")
def parts(built):
    """The encoder, heads and ignored ids the graph was made from, and a session on the published graph."""
    model_dir = built["source"].parent / "model"
    encoder = reference.load_pytorch(model_dir)
    heads = retrieval.load_heads(built["heads"], encoder.config.hidden_size)
    ignored = list(retrieval.ignored_ids(model_dir, encoder.config).values())
    session = runtime.ort_session(built["model"] / retrieval.ONNX_FILE, 1)

    def run(ids, mask):
        got = session.run(list(retrieval.OUTPUTS), {"input_ids": ids, "attention_mask": mask})
        return dict(zip(retrieval.OUTPUTS, got, strict=True))

    return {"encoder": encoder, "heads": heads, "ignored": ignored, "run": run, "model_dir": model_dir}


def _case(parts, name):
    cases = retrieval.parity_cases(parts["model_dir"] / "tokenizer.json", parts["encoder"].config)
    return next(c for c in cases if c.name == name)


def test_graph_contract(built):
    model = onnx.load(str(built["model"] / retrieval.ONNX_FILE))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18)]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    shapes = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
              for o in model.graph.output}
    vocab = json.loads((built["model"] / retrieval.CONFIG_FILE).read_text())["vocab_size"]
    assert shapes == {"dense": ["batch", 16], "sparse": ["batch", vocab],
                      "colbert": ["batch", "sequence", 16]}
    (scatter,) = [n for n in model.graph.node if n.op_type == "ScatterElements"]
    assert {a.name: a.s for a in scatter.attribute}["reduction"] == b"max"
    assert not [n for n in model.graph.node if n.op_type == "If"]  # the stock symbolic's rank-0 branches


def test_graph_attends_one_head_at_a_time(built):
    """Each softmax holds one head's scores ([batch, 1, sequence, sequence]): an 8,192-piece input then
    needs 1/16 of the memory BGE-M3's 16 heads would need at once."""
    model = onnx.load(str(built["model"] / retrieval.ONNX_FILE))
    config = json.loads((built["model"] / retrieval.CONFIG_FILE).read_text())
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
        with retrieval.attention(encoder, retrieval.PER_HEAD_ATTENTION):
            per_head = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        calls = []
        with pytest.MonkeyPatch.context() as patch:  # the reference's encoder runs PyTorch's fused kernel
            sdpa = torch.nn.functional.scaled_dot_product_attention
            patch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                          lambda *a, **k: calls.append(1) or sdpa(*a, **k))
            want = retrieval.reference(encoder, parts["heads"], parts["ignored"], batch.input_ids,
                                       batch.attention_mask)
    assert encoder.config._attn_implementation == "eager"  # each block restores the model's own
    assert len(calls) == encoder.config.num_hidden_layers
    torch.testing.assert_close(per_head, eager, rtol=0, atol=1e-6)
    assert not torch.equal(per_head, torch.zeros_like(per_head))
    dense = eager[:, 0].double() / eager[:, 0].double().norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(want["dense"], dense.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("output", retrieval.OUTPUTS)
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
    want = retrieval.reference(parts["encoder"], parts["heads"], parts["ignored"], ids, mask)[output]
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
    unk = retrieval.ignored_ids(parts["model_dir"], parts["encoder"].config)["unk"]
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
    assert list(rows[0]) == retrieval.PARITY_COLUMNS
    cases = {r["case"] for r in rows}
    assert len(cases) >= 8 and {"english", "short", "long", "multilingual", "repeated", "padding_tail",
                                "batch"} <= cases
    assert all(r["allclose"] == "True" for r in rows) and len(rows) == 3 * len(cases)
    long = next(r for r in rows if r["case"] == "long")
    assert int(long["tokens"]) == 128  # xlmr-tiny's 130 positions less padding_idx + 1
    assert "| batch | colbert |" in (built["base"] / "parity.md").read_text()
    fragment = (built["base"] / "provenance/retrieval/retrieval_export.md").read_text()
    assert "keeps the first position" in fragment and "| long | sparse |" in fragment
    size = sum(p.stat().st_size for p in built["model"].iterdir()
               if p.name in (retrieval.ONNX_FILE, retrieval.DATA_FILE))
    assert f"x the graph's {size:,} bytes" in fragment and "peak memory of the export:" in fragment
    assert "| check the graph in ONNX Runtime, case by case |" in fragment


def test_memory_of_each_phase(built, tmp_path):
    record, rows, memory = retrieval.export_graph(built["source"], built["heads"], tmp_path / "m", SETTINGS)
    assert [p["phase"] for p in memory.phases] == [
        "load the PyTorch model; the reference of every case", "export to ONNX (TorchScript tracer)",
        "optimise, check and save the graph", "check the graph in ONNX Runtime, case by case"]
    assert memory.reset  # Linux: each phase's peak is its own
    assert all(p["peak_mib"] >= p["resident_before_mib"] > 0 for p in memory.phases)
    assert memory.model_bytes == (tmp_path / "m" / retrieval.ONNX_FILE).stat().st_size
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
    assert not list(built["base"].glob(".*.tmp"))  # no staging directory left behind
    assert retrieval.verify(built["model"], retrieval.MANIFEST) == []


def test_verify_names_each_changed_and_missing_file(built, tmp_path, capsys):
    copy = tmp_path / "model"
    shutil.copytree(built["model"], copy)
    verify = ["verify", str(copy), "--manifest", retrieval.MANIFEST, "--provenance", str(tmp_path / "v.md")]
    assert command(*verify) == 0
    assert "| " + str(copy) + " | " in (tmp_path / "v.md").read_text()
    (tmp_path / "v.md").unlink()
    expected = files.sha256_file(copy / retrieval.TOKENIZER_FILE)
    with open(copy / retrieval.TOKENIZER_FILE, "a") as handle:
        handle.write(" ")
    (copy / retrieval.ONNX_FILE).unlink()
    capsys.readouterr()
    assert command(*verify) == 1
    assert not (tmp_path / "v.md").exists()  # no fragment unless every file matches
    err = capsys.readouterr().err
    assert f"{copy / retrieval.ONNX_FILE} is missing" in err
    assert f"{copy / retrieval.TOKENIZER_FILE} changed" in err and expected in err


def test_external_data_graph_is_published_whole(built, tmp_path):
    out = tmp_path / "external"
    settings = dataclasses.replace(SETTINGS, external_data="always")
    record, rows, memory = retrieval.export_graph(built["source"], built["heads"], out, settings)
    assert {e["path"] for e in record["files"]} >= {retrieval.ONNX_FILE, retrieval.DATA_FILE}
    assert (out / retrieval.ONNX_FILE).stat().st_size < (out / retrieval.DATA_FILE).stat().st_size
    assert all(r["allclose"] for r in rows) and retrieval.verify(out, retrieval.MANIFEST) == []
    (out / retrieval.DATA_FILE).unlink()
    assert [p for p in retrieval.verify(out, retrieval.MANIFEST) if retrieval.DATA_FILE in p]


def test_a_failed_check_publishes_nothing(built, tmp_path):
    out = tmp_path / "strict" / "model"
    with pytest.raises(retrieval.RetrievalError, match="nothing was written"):
        retrieval.export_graph(built["source"], built["heads"], out,
                               dataclasses.replace(SETTINGS, tolerance=1e-30))
    assert list((tmp_path / "strict").iterdir()) == []


def test_opset_without_max_scatter_is_refused(built, tmp_path):
    with pytest.raises(retrieval.RetrievalError, match="opset 18"):
        retrieval.export_graph(built["source"], built["heads"], tmp_path / "m",
                               dataclasses.replace(SETTINGS, opset=17))


def test_heads_are_reproducible_and_read_like_flagembedding_files(built, tmp_path):
    again = retrieval.save_heads(retrieval.random_heads(16, 0), tmp_path / "again")
    for path in again:
        assert files.sha256_file(path) == files.sha256_file(built["heads"] / path.name)
    # BGE-M3 ships fp16 state dicts; the sparse head has one output.
    half = {name: {k: v.half() for k, v in state.items()}
            for name, state in retrieval.random_heads(16, 1).items()}
    retrieval.save_heads(half, tmp_path / "half")
    heads = retrieval.load_heads(tmp_path / "half", 16)
    assert heads.sparse.weight.dtype == torch.float32 and tuple(heads.sparse.weight.shape) == (1, 16)
    with pytest.raises(retrieval.RetrievalError, match=r"colbert_linear\.pt.*expected weight \[dim, 24\]"):
        retrieval.load_heads(tmp_path / "half", 24)
    two = dict(half, **{retrieval.SPARSE_FILE: {"weight": torch.zeros(2, 16), "bias": torch.zeros(2)}})
    retrieval.save_heads(two, tmp_path / "two")
    with pytest.raises(retrieval.RetrievalError, match=r"sparse_linear\.pt.*expected weight \[1, 16\]"):
        retrieval.load_heads(tmp_path / "two", 16)
