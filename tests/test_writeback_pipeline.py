"""Pipeline files whose fine-tuned tagger is written into a graph beside them (format /3): the round
trip to one ONNX Runtime session with the run's predictions, equal bytes, the inline option, files
written before /2 and /3 existed, refusals of a missing or changed graph, and nothing half-written.
The graph itself (byte identity, the head, the pooling): test_writeback_graph.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import boot_argv, runner
from encoder_study.core import files
from encoder_study.data import conllu, synthetic
from encoder_study.encoders.frozen import FrozenEncoder
from encoder_study.encoders.trainable.words import TrainableEncoder
from encoder_study.onnx import names, patch
from encoder_study.provenance import artefacts
from encoder_study.recipes import writeback
from encoder_study.recipes.tagging import pipeline
from encoder_study.recipes.tagging.graph import GraphTagger
from encoder_study.recipes.tagging.tagger import Tagger
from encoder_study.recipes.writeback import checks

GRAPH = "pipeline.encoder0.onnx"


run = runner("writeback")


@pytest.fixture(scope="module")
def test_docs(tmp_path_factory) -> list:
    paths = synthetic.write_synthetic(tmp_path_factory.mktemp("bank"), seed=0,
                                     sizes={"train": 2, "dev": 2, "test": 24})
    return [s.doc() for s in conllu.read_conllu(paths["test"])]


def finetuned(model_dir, pooling="mean", train_tokens=False, seed=1) -> Tagger:
    """A tagger whose layers (and token table, if asked) moved as a fine-tune moves them."""
    encoder = TrainableEncoder(model_dir, pooling=pooling, max_length=64, freeze_embeddings=not train_tokens)
    tagger = Tagger(encoder, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tagger.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return tagger.eval()


def logits(tagger, docs) -> np.ndarray:
    if isinstance(tagger, GraphTagger):
        return np.concatenate(tagger.logits(docs))
    with torch.no_grad():
        return tagger(docs).numpy()


def listing(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir())


CASES = [("bert-tiny", "mean", True), ("xlmr-tiny", "first", False), ("modernbert-tiny", "mean", True),
         ("minilm", "mean", False)]


@pytest.mark.parametrize("name, pooling, train_tokens", CASES)
def test_graph_pipeline_round_trip(tiny_exports, minilm_export, test_docs, tmp_path, name, pooling,
                                   train_tokens):
    model_dir = minilm_export if name == "minilm" else tiny_exports[name]
    tagger = finetuned(model_dir, pooling, train_tokens)
    out = tmp_path / "a"
    saved = writeback.save_with_graph(tagger, out / pipeline.FILE_NAME, training={"run": name})
    assert listing(out) == [GRAPH, pipeline.FILE_NAME]  # no temporary file left
    assert saved.graph == out / GRAPH and saved.report.rewritten
    assert ("model.embeddings.word_embeddings.weight" in saved.report.rewritten
            or "model.embeddings.tok_embeddings.weight" in saved.report.rewritten) == train_tokens
    assert saved.report.appended == [names.HEAD_WEIGHT, names.HEAD_BIAS]
    assert saved.report.appended_inputs == ["word_pieces"]
    assert saved.report.appended_outputs == ["logits", "tags"]
    settings, tensors = pipeline.read(saved.path)
    assert settings["format"] == pipeline.TAGGER_FORMAT and settings["kind"] == "transformer"
    assert settings["encoder"]["graph"] == {"file": GRAPH, "sha256": files.sha256_file(out / GRAPH),
                                            "bytes": (out / GRAPH).stat().st_size}
    assert settings["encoder"]["settings"] == {"pooling": pooling, "max_length": 64, "batch_size": 8,
                                               "optimization": "all"}
    assert tensors == {}  # the encoder's weights and the head's are in the graph
    assert settings["training"] == {"run": name}

    loaded = pipeline.load(saved.path)
    assert isinstance(loaded, GraphTagger) and loaded.graph == out / GRAPH
    assert (loaded.encoder.pooling, loaded.encoder.max_length_requested) == (pooling, 64)
    ours, theirs = logits(tagger, test_docs), logits(loaded, test_docs)
    print(f"{name}: logits of the written graph vs the modules, max abs {np.abs(ours - theirs).max():.2g}")
    assert np.abs(ours - theirs).max() < 1e-4
    assert loaded.predict(test_docs) == tagger.predict(test_docs)  # no differing tag

    # Equal weights, equal bytes: the same tagger saved again, and the loaded one saved elsewhere.
    again = writeback.save_with_graph(tagger, tmp_path / "b" / pipeline.FILE_NAME, {"run": name}).path
    copied = pipeline.save(loaded, tmp_path / "c" / pipeline.FILE_NAME, training={"run": name})
    for other in (again.parent, copied.parent):
        assert listing(other) == [GRAPH, pipeline.FILE_NAME]
        for part in (pipeline.FILE_NAME, GRAPH):
            assert (other / part).read_bytes() == (out / part).read_bytes()


def test_a_format_2_pair_still_loads_as_a_frozen_encoder(tiny_exports, test_docs, tmp_path):
    """The pair the recipe wrote before /3: the encoder alone in the graph, the head in the file."""
    model_dir = tiny_exports["xlmr-tiny"]
    tagger = finetuned(model_dir, "first")
    source = model_dir / "model.onnx"

    def encoder_only(target):
        return patch.patch(source, target, writeback.module_weights_to_graph(tagger.encoder.encoder, source))

    path = pipeline.save_pair(tagger, tmp_path / "old" / pipeline.FILE_NAME, encoder_only, {"run": "x"}).path
    settings, tensors = pipeline.read(path)
    assert settings["format"] == pipeline.GRAPH_FORMAT and sorted(tensors) == ["head.bias", "head.weight"]
    loaded = pipeline.load(path)
    assert isinstance(loaded.encoder, FrozenEncoder) and loaded.encoder.graph == path.with_name(GRAPH)
    assert np.abs(logits(loaded, test_docs) - logits(tagger, test_docs)).max() < 1e-4
    assert loaded.predict(test_docs) == tagger.predict(test_docs)
    copied = pipeline.save(loaded, tmp_path / "copy" / pipeline.FILE_NAME, training={"run": "x"})
    for part in (pipeline.FILE_NAME, GRAPH):
        assert (copied.parent / part).read_bytes() == (path.parent / part).read_bytes()


def test_an_inline_pipeline_keeps_a_trainable_encoder(tiny_exports, test_docs, tmp_path):
    tagger = finetuned(tiny_exports["xlmr-tiny"])
    path = pipeline.save(tagger, tmp_path / pipeline.FILE_NAME)
    assert listing(tmp_path) == [pipeline.FILE_NAME]
    settings, _ = pipeline.read(path)
    assert (settings["format"], settings["kind"]) == (pipeline.FORMAT, "transformer-trainable")
    loaded = pipeline.load(path)
    assert isinstance(loaded.encoder, TrainableEncoder)
    assert np.array_equal(logits(loaded, test_docs), logits(tagger, test_docs))
    # It can train further: one step moves the layers.
    before = {k: v.clone() for k, v in loaded.trainable_state().items()}
    loaded.train()
    optimizer = torch.optim.SGD([p for p in loaded.parameters() if p.requires_grad], lr=0.1)
    loss = torch.nn.functional.cross_entropy(loaded(test_docs[:4]),
                                             torch.zeros(sum(len(d.words) for d in test_docs[:4]),
                                                         dtype=torch.long))
    loss.backward()
    optimizer.step()
    moved = [k for k, v in loaded.trainable_state().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("encoder.") for k in moved)


# -- files written before format /2 --------------------------------------------------------------------

def _split_tensors_v1(value, path, tensors):
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().contiguous().clone()
        return {"tensor": path}
    if isinstance(value, dict):
        return {str(k): _split_tensors_v1(v, f"{path}/{k}", tensors) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_split_tensors_v1(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    return value


def save_v1(tagger, path, training=None) -> Path:
    """The writer as it was before format /2 (commit 464dbe6), kept here so that its files stay readable
    whatever the current writer becomes."""
    from safetensors.torch import save as to_bytes

    path = Path(path)
    encoder = tagger.encoder
    relative = Path(os.path.relpath(Path(encoder.model_dir).resolve(), path.resolve().parent)).as_posix()
    tensors = {"head." + n: t.detach().contiguous().clone() for n, t in tagger.head.state_dict().items()}
    reference = {"model": encoder.manifest.get("model"), "files": tagger.encoder_files(),
                 "model_dir": relative}
    if tagger.trainable_encoder:
        checkpoint = _split_tensors_v1(encoder.checkpoint(), "encoder", tensors)
        settings = {"checkpoint": checkpoint, "max_batch_pieces": encoder.max_batch_pieces}
    else:
        settings = {"pooling": encoder.pooling, "max_length": encoder.max_length_requested,
                    "batch_size": encoder.batch_size, "optimization": encoder.optimization}
    record = {"format": "encoder_study.tagging.pipeline/1", "kind": tagger.kind, "tags": list(tagger.tags),
              "width": encoder.width, "pooling": encoder.pooling,
              "encoder": {**reference, "settings": settings}}
    if training is not None:
        record["training"] = training
    text = json.dumps(record, sort_keys=True, ensure_ascii=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(to_bytes(tensors, metadata={"encoder_study.pipeline": text}))
    return path


@pytest.mark.parametrize("kind", ["transformer", "transformer-trainable"])
def test_a_file_written_before_format_2_still_loads(tiny_exports, test_docs, tmp_path, kind):
    model_dir = tiny_exports["modernbert-tiny"]
    if kind == "transformer":
        tagger = Tagger(FrozenEncoder(model_dir, pooling="first", max_length=64), seed=3)
    else:
        tagger = finetuned(model_dir, train_tokens=True)
    old = save_v1(tagger, tmp_path / "old" / pipeline.FILE_NAME, training={"steps": 1})
    loaded = pipeline.load(old)
    assert loaded.kind == kind
    assert np.array_equal(logits(loaded, test_docs), logits(tagger, test_docs))
    # Without a written graph the writer still writes the old settings and tensors (old readers read
    # them), and the SHA-256 of the file's content beside them in the settings (old readers ignore it).
    new = pipeline.save(tagger, tmp_path / "new" / pipeline.FILE_NAME, training={"steps": 1})
    (old_settings, old_tensors), (new_settings, new_tensors) = raw(old), raw(new)
    assert new_settings.pop(artefacts.KEY) and new_settings == old_settings
    assert old_tensors.keys() == new_tensors.keys()
    assert all(torch.equal(old_tensors[k], new_tensors[k]) for k in old_tensors)


def raw(path) -> tuple[dict, dict]:
    """A pipeline file's settings and tensors as safetensors gives them, unchecked."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        settings = json.loads(handle.metadata()["encoder_study.pipeline"])
        return settings, {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118


def test_an_unknown_format_is_refused(tiny_exports, tmp_path):
    from safetensors.torch import save as to_bytes

    tagger = finetuned(tiny_exports["bert-tiny"])
    path = writeback.save_with_graph(tagger, tmp_path / pipeline.FILE_NAME).path
    settings, tensors = pipeline.read(path)
    for change, match in (({"format": "encoder_study.tagging.pipeline/4"}, "this code reads"),
                          ({"encoder": {**settings["encoder"], "graph": {**settings["encoder"]["graph"],
                                                                         "file": "../model.onnx"}}},
                           "plain file name"),
                          ({"encoder": {k: v for k, v in settings["encoder"].items() if k != "graph"}},
                           "without a valid written graph")):
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(to_bytes(tensors, metadata={"encoder_study.pipeline": json.dumps({**settings,
                                                                                          **change})}))
        with pytest.raises(pipeline.PipelineError, match=match):
            pipeline.load(bad)


# -- refusals and atomicity ------------------------------------------------------------------------------

def test_a_missing_or_changed_graph_is_refused_naming_both_files(tiny_exports, tmp_path):
    path = writeback.save_with_graph(finetuned(tiny_exports["bert-tiny"]), tmp_path / pipeline.FILE_NAME).path
    graph = tmp_path / GRAPH
    original = graph.read_bytes()
    graph.unlink()
    with pytest.raises(pipeline.PipelineError) as err:
        pipeline.load(path)
    message = str(err.value)
    assert str(path) in message and str(graph) in message and "missing" in message
    assert "travel together" in message and "save the tagger again" in message

    changed = bytearray(original)
    changed[-3] ^= 0xFF
    graph.write_bytes(bytes(changed))
    with pytest.raises(pipeline.PipelineError) as err:
        pipeline.load(path)
    message = str(err.value)
    assert str(path) in message and str(graph) in message
    recorded = pipeline.read(path)[0]["encoder"]["graph"]["sha256"]
    assert files.sha256_file(graph) in message and recorded in message

    graph.write_bytes(original)
    pipeline.load(path)  # restored: loads again


def test_a_moved_pair_loads_and_a_pipeline_moved_alone_does_not(tiny_exports, tmp_path):
    model_dir = tmp_path / "models" / "bert-tiny"
    shutil.copytree(tiny_exports["bert-tiny"], model_dir)
    path = writeback.save_with_graph(finetuned(model_dir), tmp_path / "runs" / "a" / pipeline.FILE_NAME).path
    moved = tmp_path / "runs" / "b"
    moved.mkdir()
    shutil.copy(path, moved / pipeline.FILE_NAME)
    with pytest.raises(pipeline.PipelineError, match="missing"):
        pipeline.load(moved / pipeline.FILE_NAME)
    shutil.copy(path.with_name(GRAPH), moved / GRAPH)
    assert isinstance(pipeline.load(moved / pipeline.FILE_NAME), GraphTagger)


def test_a_failed_patch_leaves_nothing(tiny_exports, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_exports["bert-tiny"], model_dir)
    tagger = finetuned(model_dir)
    out = tmp_path / "out"
    out.mkdir()
    with open(model_dir / "model.onnx", "ab") as handle:  # the graph the weights came from changed
        handle.write(b"\0")
    with pytest.raises(files.IntegrityError, match="the graph the encoder came from"):
        writeback.save_with_graph(tagger, out / pipeline.FILE_NAME)
    assert listing(out) == []


def test_a_failed_pipeline_write_leaves_no_graph_and_keeps_an_existing_pair(tiny_exports, tmp_path,
                                                                           monkeypatch):
    import safetensors.torch

    out = tmp_path / "out"
    out.mkdir()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    tagger = finetuned(tiny_exports["bert-tiny"])
    monkeypatch.setattr(safetensors.torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        writeback.save_with_graph(tagger, out / pipeline.FILE_NAME)
    assert listing(out) == []
    monkeypatch.undo()

    path = writeback.save_with_graph(tagger, out / pipeline.FILE_NAME).path
    before = {name: (out / name).read_bytes() for name in listing(out)}
    other = finetuned(tiny_exports["bert-tiny"], seed=2)
    monkeypatch.setattr(safetensors.torch, "save", broken)
    with pytest.raises(OSError):
        writeback.save_with_graph(other, path)
    assert {name: (out / name).read_bytes() for name in listing(out)} == before


# -- the recipe's commands -----------------------------------------------------------------------------

def test_the_writeback_commands_write_their_tables_and_fragments(tiny_exports, tmp_path):
    from encoder_study.core import tables

    bank = synthetic.write_synthetic(tmp_path / "bank", seed=0, sizes={"train": 2, "dev": 2, "test": 16})
    texts = tmp_path / "texts.jsonl"
    sample = ["The bank floods.", "Ça va très bien, merci !", "Ein längerer Satz " * 30]
    texts.write_text("".join(json.dumps({"id": str(i), "source": "test", "lang": "eng", "text": t}) + "\n"
                             for i, t in enumerate(sample)), encoding="utf-8")
    runs = []
    for name in ("bert-tiny", "modernbert-tiny"):
        inline = tmp_path / "tagging" / name / pipeline.FILE_NAME
        pipeline.save(finetuned(tiny_exports[name]), inline, training={"run": name})
        out = tmp_path / "writeback" / name / pipeline.FILE_NAME
        assert run("pipeline", "--inline", str(inline), "--out", str(out), "--threads", "1",
                   "--provenance", str(tmp_path / "prov" / f"writeback_pipeline-{name}.md")) == 0
        assert listing(out.parent) == [GRAPH, pipeline.FILE_NAME]
        assert pipeline.training_summary(out)["inline_pipeline_sha256"] == files.sha256_file(inline)
        fragment = (tmp_path / "prov" / f"writeback_pipeline-{name}.md").read_text()
        assert files.sha256_file(out.with_name(GRAPH)) in fragment and "peak memory of writing" in fragment
        runs += ["--run", name, str(inline), str(out)]

    def command(action, *extra):
        out = tmp_path / "writeback" / f"{action}.csv"
        assert run(action, *runs, "--out", str(out), "--provenance",
                   str(tmp_path / "prov" / f"writeback_{action}.md"), *extra) == 0
        assert out.with_suffix(".md").is_file()
        return out, tables.read_csv(out)

    parity, rows = command("parity", "--texts", str(texts), "--threads", "1")
    assert [(r["run"], r["comparison"]) for r in rows] == [
        (name, comparison) for name in ("bert-tiny", "modernbert-tiny")
        for comparison in checks.COMPARISONS]
    for r in rows:
        assert int(r["tokens"]) > 50
        if r["comparison"] == "export graph vs modules":  # the export's own graph: the moved weights show
            assert float(r["max_abs"]) > 1e-3
        else:  # the written graph's states, and the written pipeline's logits (every word of the texts)
            assert float(r["max_abs"]) < 1e-5 and float(r["min_cos"]) > 0.99999
    words = sum(len(t.split()) for t in sample)
    assert [r["tokens"] for r in rows if r["comparison"] == checks.COMPARISONS[2]] == [str(words)] * 2

    agreement, rows = command("agreement", "--test", str(bank["test"]), "--pred-dir",
                              str(tmp_path / "writeback"), *boot_argv(200),
                              "--threads", "1")
    assert [r["differing_tokens"] for r in rows] == ["0", "0"]
    assert all(r["upos"] == r["upos_inline"] and float(r["ci_low"]) <= float(r["upos"]) <= float(r["ci_high"])
               for r in rows)
    for name in ("bert-tiny", "modernbert-tiny"):
        assert (tmp_path / "writeback" / name / "test.pred.conllu").is_file()

    _, rows = command("speed", "--test", str(bank["test"]), "--sentences", "8", "--batch-pieces", "24",
                      "--warmup", "0", "--repeats", "2", "--threads", "2", "--min-seconds", "0.01")
    assert sorted({int(r["threads"]) for r in rows}) == sorted({1, min(2, os.cpu_count() or 1)})
    for r in rows:
        # the same batches for both paths, longest first within the budget: some padding, none counted
        assert int(r["batches"]) > 1 and int(r["padded_pieces"]) >= int(r["pieces"]) > int(r["tokens"])
        assert int(r["batch_pieces"]) == 24 and int(r["calls"]) in (1, int(r["batches"]))
        # the limit beside the row, as every timing table carries it; a note exactly where a path outran it
        assert float(r["gemm_gflops_min"]) <= float(r["gemm_gflops"]) <= float(r["gemm_gflops_max"])
        assert r["gemm_probe"] and float(r["peak_gflops"]) > 0
        above = [impl for impl in ("modules", "graph") if float(r[f"{impl}_fraction_of_gemm"]) > 1.0]
        assert [part.split(":")[0] for part in r["limit_note"].split("; ") if part] == above
        for impl in ("modules", "graph"):
            low, mid, high = (float(r[f"{impl}_tok_s{s}"]) for s in ("_min", "", "_max"))
            assert 0 < low <= mid <= high and int(r[f"{impl}_repeats"]) >= 2
            assert float(r[f"{impl}_seconds"]) >= 0.01
            assert float(r[f"{impl}_fraction_of_gemm"]) == pytest.approx(
                float(r[f"{impl}_gflops"]) / float(r["gemm_gflops"]))
            single = next(q for q in rows if q["run"] == r["run"] and q["threads"] == "1")
            assert float(r[f"{impl}_scaling"]) == pytest.approx(mid / float(single[f"{impl}_tok_s"]))

    # Equal inputs, equal bytes (the timing table aside).
    before = {p: p.read_bytes() for p in (parity, agreement)}
    command("parity", "--texts", str(texts), "--threads", "1")
    command("agreement", "--test", str(bank["test"]), "--pred-dir", str(tmp_path / "writeback"),
            *boot_argv(200), "--threads", "1")
    assert {p: p.read_bytes() for p in before} == before


def test_the_pipeline_command_refuses_a_frozen_run(tiny_exports, tmp_path):
    frozen = pipeline.save(Tagger(FrozenEncoder(tiny_exports["bert-tiny"])), tmp_path / "in.safetensors")
    out, fragment = tmp_path / "out" / "p.safetensors", tmp_path / "prov.md"
    with pytest.raises(pipeline.PipelineError, match="only a fine-tuned run's"):  # cli.py: exit status 2
        run("pipeline", "--inline", str(frozen), "--out", str(out), "--threads", "1",
            "--provenance", str(fragment))
    assert not (tmp_path / "out").exists() and not (tmp_path / "prov.md").exists()


def test_save_with_graph_refuses_a_frozen_tagger(tiny_exports, tmp_path):
    with pytest.raises(pipeline.PipelineError, match="no fine-tuned weights"):
        writeback.save_with_graph(Tagger(FrozenEncoder(tiny_exports["bert-tiny"])),
                                  tmp_path / "p.safetensors")
    assert listing(tmp_path) == []
