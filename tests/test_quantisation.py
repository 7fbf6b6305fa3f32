"""Int8 variants of the written taggers (issue 35): made by ONNX Runtime's quantiser, measured against the
float32 written graph, published beside the pipeline only within the thresholds (else one line and an
empty folder), loaded by their own pipeline file or `variants.resolve`, refused when damaged, listed with
their SHA-256 in their manifest and in the job's fragment (what the run crate lists); and the measures of
the retrieval variant's gate on the edge cases."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_writeback_graph import finetuned

from conftest import ROOT, cli_runner, runner
from encoder_study.core import files, tables
from encoder_study.data import conllu
from encoder_study.onnx import quantise as quantiser
from encoder_study.provenance import crate, twin
from encoder_study.provenance.records import read_record
from encoder_study.recipes import writeback
from encoder_study.recipes.retrieval import quantise as retrieval_quantise
from encoder_study.recipes.tagging import pipeline, variants
from encoder_study.recipes.tagging.graph import GraphTagger

command = cli_runner("writeback")
WORDS = ["The", "bank", "of", "the", "river", "floods", "and", "a", "dog", "runs", "."]
TAGS = ["DET", "NOUN", "ADP", "DET", "NOUN", "VERB", "CCONJ", "DET", "NOUN", "VERB", "PUNCT"]


def _conllu(path: Path, sentences: int, shift: int) -> Path:
    """A small gold file: `sentences` rotations of WORDS with their tags."""
    blocks = []
    for s in range(sentences):
        k = (s + shift) % len(WORDS)
        words, tags = WORDS[k:] + WORDS[:k], TAGS[k:] + TAGS[:k]
        lines = [f"# sent_id = s{s}", f"# text = {' '.join(words)}"]
        lines += [f"{i}\t{w}\t_\t{t}\t_\t_\t0\t_\t_\t_"
                  for i, (w, t) in enumerate(zip(words, tags, strict=True), 1)]
        blocks.append("\n".join(lines) + "\n")
    files.write_text(path, "\n".join(blocks) + "\n")
    return path


@pytest.fixture(scope="module")
def written(tiny_exports, tmp_path_factory) -> dict:
    """A fine-tuned bert-tiny tagger written into its graph (results/writeback/<run>/ in the workflow),
    and two gold splits."""
    base = tmp_path_factory.mktemp("quantisation")
    path = base / "bert-tiny" / pipeline.FILE_NAME
    writeback.save_with_graph(finetuned(tiny_exports["bert-tiny"]), path)
    return {"base": base, "pipeline": path, "dev": _conllu(base / "dev.conllu", 6, 0),
            "test": _conllu(base / "test.conllu", 8, 3)}


def _quantise(written: dict, out: Path, drop: str, differing: str, capsys) -> tuple[int, list[str]]:
    status = command(
        "quantisation", "--run", "bert-tiny", str(written["pipeline"]), str(out / "bert-tiny" / "int8"),
        "--split", "dev", str(written["dev"]), "--split", "test", str(written["test"]),
        "--bootstrap-resamples", "50", "--bootstrap-seed", "0", "--bootstrap-confidence", "0.95",
        "--bootstrap-method", "percentile", "--quantisation-per-channel",
        "--quantisation-max-upos-drop", drop,
        "--quantisation-max-differing-percent", differing, "--threads", "1",
        "--out", str(out / "quantisation.csv"),
        "--provenance", str(out / "prov" / "writeback_quantisation.md"))
    return status, capsys.readouterr().out.splitlines()


def test_a_variant_over_a_threshold_is_refused_in_one_line_and_nothing_published(written, tmp_path, capsys):
    # A negative drop allowed: the int8 graph would have to tag better than float32 by a point.
    status, said = _quantise(written, tmp_path, "-1", "100", capsys)
    assert status == 0
    assert len(said) == 1 and said[0].startswith("bert-tiny: int8 variant not published: on dev UPOS drops")
    assert "writeback.quantisation.max_upos_drop -1" in said[0]
    folder = tmp_path / "bert-tiny" / "int8"
    assert folder.is_dir() and not any(folder.iterdir())
    rows = tables.read_csv(tmp_path / "quantisation.csv")
    assert [r["split"] for r in rows] == ["dev", "test"]
    assert {r["published"] for r in rows} == {"False"} and rows[0]["decision"] == said[0]
    with pytest.raises(pipeline.PipelineError, match="no int8 variant is published"):
        variants.resolve(written["pipeline"], "int8")
    # Differing tags gate too: none may differ.
    status, said = _quantise(written, tmp_path, "100", "-1", capsys)
    assert len(said) == 1 and "of the tags differ" in said[0] and not any(folder.iterdir())


@pytest.fixture(scope="module")
def published(written, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("published")
    assert command(
        "quantisation", "--run", "bert-tiny", str(written["pipeline"]), str(out / "bert-tiny" / "int8"),
        "--split", "test", str(written["test"]), "--bootstrap-resamples", "50", "--bootstrap-seed", "0",
        "--bootstrap-confidence", "0.95", "--bootstrap-method", "percentile", "--quantisation-per-channel",
        "--quantisation-max-upos-drop", "100", "--quantisation-max-differing-percent", "100",
        "--threads", "1", "--out", str(out / "quantisation.csv"),
        "--provenance", str(out / "prov" / "writeback_quantisation.md")) == 0
    return out


def test_a_published_variant_is_an_int8_pipeline_beside_the_float32_one(written, published):
    folder = published / "bert-tiny" / "int8"
    path = folder / pipeline.FILE_NAME
    assert sorted(p.name for p in folder.iterdir()) == sorted([pipeline.FILE_NAME, pipeline.graph_name(path),
                                                               variants.MANIFEST])
    tagger = pipeline.load(path)
    assert isinstance(tagger, GraphTagger)
    ops = {n.op_type for n in onnx.load(str(tagger.graph)).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    float32 = pipeline.load(written["pipeline"])
    docs = [s.doc() for s in conllu.read_conllu(written["test"])]
    assert len(tagger.predict(docs)) == len(float32.predict(docs))
    # The pipeline's own settings say what it is and what it was made from.
    settings, _ = pipeline.read(path)
    variant = settings["training"]["variant"]
    assert variant["name"] == "int8" and variant["quantisation"]["method"] == quantiser.METHOD
    assert variant["of"]["pipeline"]["sha256"] == files.sha256_file(written["pipeline"])
    # `--variant int8` resolves to it (and float32 to the pipeline itself), beside the float32 file.
    moved = written["pipeline"].parent / "int8"
    moved.mkdir(exist_ok=True)
    for p in folder.iterdir():
        (moved / p.name).write_bytes(p.read_bytes())
    assert variants.resolve(written["pipeline"], "int8") == moved / pipeline.FILE_NAME
    assert variants.resolve(written["pipeline"], "float32") == written["pipeline"]
    pipeline.load(variants.resolve(written["pipeline"], "int8"))
    rows = tables.read_csv(published / "quantisation.csv")
    assert rows[0]["published"] == "True" and rows[0]["int8_sha256"] == files.sha256_file(tagger.graph)


def test_the_variants_hashes_are_in_its_manifest_and_in_the_fragment_the_crate_lists(published):
    folder = published / "bert-tiny" / "int8"
    manifest = json.loads((folder / variants.MANIFEST).read_text(encoding="utf-8"))
    listed = {e["path"]: e["sha256"] for e in manifest["files"]}
    assert listed == {name: files.sha256_file(folder / name)
                      for name in (pipeline.FILE_NAME, pipeline.graph_name(pipeline.FILE_NAME))}
    assert manifest["quantisation"]["sha256"] == listed[pipeline.graph_name(pipeline.FILE_NAME)]
    record = read_record(twin(published / "prov" / "writeback_quantisation.md"))
    outputs = {Path(f["path"]).name: f["sha256"] for f in record["files"] if f["role"] == "output"
               and Path(f["path"]).parent.name == "int8"}
    assert outputs == {**listed, variants.MANIFEST: files.sha256_file(folder / variants.MANIFEST)}


def test_a_corrupted_int8_graph_is_refused_like_any_export(published):
    folder = published / "bert-tiny" / "damaged"  # beside int8/: the export is found at the same depth
    folder.mkdir()
    for p in (published / "bert-tiny" / "int8").iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    graph = folder / pipeline.graph_name(pipeline.FILE_NAME)
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    with pytest.raises(pipeline.PipelineError, match="is not the one it was saved with"):
        pipeline.load(folder / pipeline.FILE_NAME)


def test_the_quantiser_is_deterministic_and_a_remade_variant_must_match(written, tmp_path):
    source = written["pipeline"].with_name(pipeline.graph_name(written["pipeline"]))
    first = quantiser.quantise(source, tmp_path / "a.onnx", True)
    again = quantiser.remake(source, tmp_path / "b.onnx", True, ("MatMul",), first["sha256"])
    assert again["sha256"] == first["sha256"]
    with pytest.raises(quantiser.QuantisationError, match="made again has SHA-256"):
        quantiser.remake(source, tmp_path / "c.onnx", False, ("MatMul",), first["sha256"])
    with pytest.raises(quantiser.QuantisationError, match="choose among"):
        quantiser.quantise(source, tmp_path / "d.onnx", True, ("Conv",))


def test_the_retrieval_gates_measures_on_their_edge_cases():
    both_empty = np.zeros((1, 20))
    assert retrieval_quantise.top_agreement(both_empty, both_empty) == 1.0
    want = np.zeros((2, 30))
    want[0, :12] = np.arange(12, 0, -1)  # 12 ids kept: the top 10 are 0..9
    want[1, 5] = 1.0
    got = want.copy()
    got[0, 9], got[0, 11] = 0.0, 20.0  # id 9 leaves the top 10, id 11 enters it
    assert retrieval_quantise.top_agreement(got, want) == pytest.approx(0.9)
    assert retrieval_quantise.sparse_correlation(want[1:], want[1:]) is None  # one id: undefined
    assert retrieval_quantise.sparse_correlation(want, want) == pytest.approx(1.0)
    row = {"dense_cos_min": 0.5, "sparse_top10_min": 1.0, "sparse_correlation": None, "colbert_cos_min": 1.0,
           "colbert_cos_p5": 1.0}
    from encoder_study.recipes.retrieval.settings import Quantisation

    gate = Quantisation(True, True, 0.99, 0.8, 0.95, 0.9, 0.95)
    assert retrieval_quantise.failures(row, gate) == ["dense_cos_min 0.5000 < min_dense_cosine 0.99"]


def test_predict_tags_with_the_published_variant_and_says_when_there_is_none(written, published, tmp_path,
                                                                             capsys):
    tagging = cli_runner("tagging")
    folder = tmp_path / "bert-tiny"
    folder.mkdir()
    for p in written["pipeline"].parent.iterdir():  # the float32 pair, with no variant beside it
        if p.is_file():
            (folder / p.name).write_bytes(p.read_bytes())
    argv = ["predict", "--pipeline", str(folder / pipeline.FILE_NAME), "--input", str(written["test"])]
    assert tagging(*argv, "--variant", "int8", "--out", str(tmp_path / "none.conllu")) == 2
    assert "no int8 variant is published beside it" in capsys.readouterr().err
    assert not (tmp_path / "none.conllu").exists()
    (folder / "int8").mkdir()
    for p in (published / "bert-tiny" / "int8").iterdir():
        (folder / "int8" / p.name).write_bytes(p.read_bytes())
    assert tagging(*argv, "--variant", "int8", "--out", str(tmp_path / "int8.conllu")) == 0
    own = ["predict", "--pipeline", str(folder / "int8" / pipeline.FILE_NAME), "--input",
           str(written["test"])]
    assert tagging(*own, "--out", str(tmp_path / "own.conllu")) == 0
    assert (tmp_path / "int8.conllu").read_bytes() == (tmp_path / "own.conllu").read_bytes()


def test_the_run_crate_lists_the_published_variant_with_its_sha256(written, tmp_path, monkeypatch):
    """End to end, as `all` does it: the job run with paths relative to the working directory, then the
    run crate built from its fragment lists every file of the int8 folder with the manifest's SHA-256."""
    monkeypatch.chdir(tmp_path)
    for name in ("Snakefile", "LICENSE", "README.md", "CITATION.cff"):
        shutil.copy2(ROOT / name, tmp_path / name)
    run_dir = Path("results/writeback/bert-tiny")
    run_dir.mkdir(parents=True)
    for p in written["pipeline"].parent.iterdir():
        if p.is_file():
            shutil.copy2(p, run_dir / p.name)
    model = Path("results/study0/models/bert-tiny")  # where the pipeline's relative reference leads
    shutil.copytree((written["pipeline"].parent / "../../study0/models/bert-tiny").resolve(), model)
    assert (run_dir / "../../study0/models/bert-tiny").resolve() == model.resolve()
    shutil.copy2(written["test"], "test.conllu")
    fragment = "provenance/writeback/writeback_quantisation.md"
    assert command(
        "quantisation", "--run", "bert-tiny", str(run_dir / pipeline.FILE_NAME), str(run_dir / "int8"),
        "--split", "test", "test.conllu", "--bootstrap-resamples", "50", "--bootstrap-seed", "0",
        "--bootstrap-confidence", "0.95", "--bootstrap-method", "percentile", "--quantisation-per-channel",
        "--quantisation-max-upos-drop", "100", "--quantisation-max-differing-percent", "100",
        "--threads", "1", "--out", "results/writeback/quantisation.csv", "--provenance", fragment) == 0
    assert runner("provenance")(
        "crate", "--base", ".", "--workflow", "Snakefile", "--citation", "CITATION.cff",
        "--license", "LICENSE", "--readme", "README.md", "--out", crate.CRATE_NAME, "--provenance",
        "provenance/provenance/provenance_crate.md", fragment) == 0
    listed = crate.files_of(json.loads(Path(crate.CRATE_NAME).read_text(encoding="utf-8")))
    manifest = json.loads((run_dir / "int8" / variants.MANIFEST).read_text(encoding="utf-8"))
    variant = {f"{run_dir}/int8/{e['path']}": e["sha256"] for e in manifest["files"]}
    assert len(variant) == 2
    for path, sha256 in variant.items():
        assert listed[path]["sha256"] == sha256
    assert listed[f"{run_dir}/int8/{variants.MANIFEST}"]["sha256"] == files.sha256_file(
        run_dir / "int8" / variants.MANIFEST)
