"""The rehearsal (config/rehearsal.yaml over config/paper.yaml): its config keeps paper.yaml's study, its
stand-in corpora are read by the streaming reader, its resources table and check, and a scaled-down run
of the same config path with small architecture files (tests/data/rehearsal-small.yaml)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, cli_runner
from encoder_study import provenance
from encoder_study.provenance.records import read_record
from encoder_study.recipes import rehearsal
from encoder_study.recipes.rehearsal import resources as rehearsal_resources
from encoder_study.recipes.student import sources

PAPER = yaml.safe_load((ROOT / "config/paper.yaml").read_text(encoding="utf-8"))
REHEARSAL = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text(encoding="utf-8"))
STEP_KEYS = {"max_steps", "warmup", "eval_every", "chunk_steps"}
# A spaCy run's published pipeline is a download: the rehearsal trains one under its name instead.
SPACY_SOURCE_KEYS = {"source", "package", "version", "url", "sha256"}


def study_keys(run: dict) -> dict:
    drop = STEP_KEYS | (SPACY_SOURCE_KEYS if run["mode"] == "spacy" else set())
    return {k: v for k, v in run.items() if k not in drop}


def test_rehearsal_keeps_the_studys_models_runs_and_student_shape():
    assert [m["name"] for m in REHEARSAL["models"]] == [m["name"] for m in PAPER["models"]]
    assert all(m["source"] == "tiny" for m in REHEARSAL["models"])
    assert [study_keys(run) for run in REHEARSAL["tagging"]["runs"]] == [study_keys(run) for run in
                                                                       PAPER["tagging"]["runs"]]
    assert all(run["source"] == "train" for run in REHEARSAL["tagging"]["runs"] if run["mode"] == "spacy")
    # No key of paper.yaml's that the run's memory depends on is changed (the window length is fixed to
    # paper.yaml's longest, so that the peak is the study's).
    training = REHEARSAL["student"]["training"]
    assert training["window_lengths"] == [max(PAPER["student"]["training"]["window_lengths"])]
    assert "batch_windows" not in training and "architecture" not in REHEARSAL["student"]
    assert "resources" not in REHEARSAL  # the table compares paper.yaml's own requests
    assert REHEARSAL["rehearsal"]["retrieval_model"]["name"] == PAPER["retrieval"]["model"]["name"]


# The real models' parameters (as AutoModel builds them: XLM-R with its pooler) and vocabulary sizes.
# XLM-R base 278,043,648 and XLM-R large 559,890,432 (514 positions) are the published counts; BGE-M3 is
# XLM-R large with 8,194 positions: + 7,680 x 1,024. mmBERT-base (307M): a 256,000 x 768 table, 22 layers of
# 5,015,040 (Wqkv 768 x 2,304, Wo 768 x 768, Wi 768 x 2,304, Wo 1,152 x 768, two bias-free norms; the first
# layer has no attention norm) and two norms: 196,608,000 + 110,330,112 + 1,536.
SHAPES = {
    "mmbert-base.json": (306_939_648, 256_000),
    "xlm-roberta-base.json": (278_043_648, 250_002),
    "bge-m3.json": (559_890_432 + 7_680 * 1_024, 250_002),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_full_size_architecture_files_have_the_real_shapes(name):
    import torch
    from transformers import AutoConfig, AutoModel

    from encoder_study.encoders import tiny

    arch = tiny.read_architecture(ROOT / "config/models" / name)
    tok = tiny.tokenizer(arch)
    parameters, vocab = SHAPES[name]
    assert tok.get_vocab_size() == vocab
    hf = dict(arch["config"])
    config = AutoConfig.for_model(hf.pop("model_type"), vocab_size=vocab, pad_token_id=1, **hf)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == parameters


def _streams(tmp_path):
    return [
        {
            "dataset": "HuggingFaceFW/fineweb-2",
            "revision": "",
            "configs": {"rus": "rus_Cyrl", "fra": "fra_Latn"},
            "local": str(tmp_path / "fw"),
        },
        {
            "dataset": "wikimedia/wikipedia",
            "revision": "",
            "configs": {"eng": "20231101.en"},
            "local": str(tmp_path / "wiki"),
        },
    ]


def test_stand_ins_are_read_by_the_streaming_reader_in_the_datasets_row_format(tmp_path):
    streams = _streams(tmp_path)
    written = rehearsal.write_streams(streams, documents=3, words=40, seed=0)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "fw/fra_Latn.jsonl",
        "fw/rus_Cyrl.jsonl",
        "wiki/20231101.en.jsonl",
    ]
    rows = [
        json.loads(line) for line in (tmp_path / "fw/rus_Cyrl.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert len(rows) == 3 and {"text", "id", "url", "language", "language_script"} <= set(rows[0])
    assert rows[0]["language"] == "rus" and all(len(r["text"].split()) == 40 for r in rows)
    assert set("".join(r["text"] for r in rows)) <= set("абвгдеёжзийклмнопрстуфхцчшщыэюя. ")
    wiki = json.loads((tmp_path / "wiki/20231101.en.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert sorted(wiki) == ["id", "text", "title", "url"]
    again = rehearsal.write_streams(_streams(tmp_path / "again"), documents=3, words=40, seed=0)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]

    docs = list(sources.streamed_documents(streams))  # no revision: a local stand-in needs none
    expected = [
        (lang, row["text"])
        for lang, path in [("fra", "fw/fra_Latn"), ("rus", "fw/rus_Cyrl"), ("eng", "wiki/20231101.en")]
        for row in map(json.loads, (tmp_path / f"{path}.jsonl").read_text(encoding="utf-8").splitlines())
    ]
    assert [(d.lang, d.text) for d in docs] == expected


def _fragment(root: Path, rule: str, wildcards: str, peak: int, seconds: float) -> None:
    record = {"format": provenance.RECORD_FORMAT, "rule": rule, "peak_rss_mb": peak, "seconds": seconds}
    stem = f"{rule}-{wildcards}" if wildcards else rule
    (root / f"{stem}.json").write_text(json.dumps(record))
    (root / f"{stem}.md").write_text("# fragment\n")


def _benchmark(path: Path, max_rss: str, seconds: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\tmax_vms\n{seconds}\t0:00:01\t{max_rss}\t1.0\n")


@pytest.fixture
def measured(tmp_path):
    prov, bench = tmp_path / "provenance/export", tmp_path / "benchmarks"
    prov.mkdir(parents=True)
    _fragment(prov, "export_model", "a", 3100, 50.0)
    _fragment(prov, "export_model", "b", 2500, 80.5)
    _benchmark(bench / "export_model/a.tsv", "2900.2", "51.0")
    _benchmark(bench / "student_distill.tsv", "4021.7", "300.0")  # a rule with a benchmark only
    _benchmark(bench / "tagging_train/x.tsv", "NA", "1.0")  # too short to sample: no peak
    return tmp_path


def test_resources_take_the_larger_peak_and_the_longest_job(measured):
    requests = {
        "export_model": {"mem_mb": 24000, "runtime": 60},
        "student_distill": {"mem_mb": 4000, "runtime": 10},
    }
    rows = rehearsal_resources.resources(requests, measured / "provenance", measured / "benchmarks",
                                         margin=1.5)
    by_rule = {r["rule"]: r for r in rows}
    assert list(by_rule) == ["export_model", "student_distill", "tagging_train"]
    export = by_rule["export_model"]
    assert (export["jobs"], export["peak_mb"], export["peak_from"], export["seconds"]) == (
        2,
        3100,
        "fragment",
        80.5,
    )
    assert export["suggested_mem_mb"] == 5000 and export["mem_over_peak"] == round(24000 / 3100, 2)
    distill = by_rule["student_distill"]
    assert (distill["peak_mb"], distill["peak_from"], distill["suggested_mem_mb"]) == (
        4022,
        "benchmark",
        6500,
    )
    assert by_rule["tagging_train"]["peak_mb"] is None and by_rule["tagging_train"]["mem_mb"] is None
    problems = rehearsal_resources.check(rows, "config/paper.yaml")
    assert problems == [
        "rule student_distill: resources.student_distill.mem_mb is 4000 in config/paper.yaml, "
        "below its measured peak of 4022 MB; raise resources.student_distill.mem_mb to at "
        "least 6500"
    ]


@pytest.mark.parametrize(
    ("peak", "margin", "expected"),
    [(2900, 1.5, 4500), (1000, 1.5, 1500), (1001, 1.0, 1500), (3334, 1.5, 5500)],
)
def test_suggested_request_rounds_up_to_500_mb(peak, margin, expected):
    assert rehearsal_resources.suggested(peak, margin) == expected


def test_the_command_writes_the_table_then_refuses_a_request_below_a_peak(measured, capsys):
    out, run = measured / "out", cli_runner("rehearsal")
    args = [
        "resources",
        "--provenance-root",
        str(measured / "provenance"),
        "--benchmarks",
        str(measured / "benchmarks"),
        "--margin",
        "1.5",
        "--below-margin",
        "warn",
        "--config-name",
        "config/paper.yaml",
        "--out",
        str(out / "resources.csv"),
        "--markdown",
        str(out / "resources.md"),
        "--provenance",
        str(measured / "provenance/rehearsal/rehearsal_resources.md"),
    ]
    ok = {
        "export_model": {"mem_mb": 24000, "runtime": 60},
        "student_distill": {"mem_mb": 8000, "runtime": 60},
    }
    assert run(*args, "--requests", json.dumps(ok)) == 0
    rows = list(csv.DictReader((out / "resources.csv").open(encoding="utf-8")))
    assert [r["rule"] for r in rows] == ["export_model", "student_distill", "tagging_train"]
    assert rows[0]["peak_mb"] == "3100" and rows[1]["mem_mb"] == "8000"
    assert "| export_model | 2 | 3100 | fragment |" in (out / "resources.md").read_text(encoding="utf-8")

    low = {**ok, "export_model": {"mem_mb": 3000, "runtime": 60}}
    assert run(*args, "--requests", json.dumps(low)) == 2
    err = capsys.readouterr().err
    assert "rule export_model" in err and "resources.export_model.mem_mb to at least 5000" in err


def test_a_request_below_the_margin_is_warned_or_refused_as_the_config_says(measured, capsys):
    """The margin the config keeps (peak x 1.5): a request that holds the peak (3100 MB) but not the
    margin is a warning line by default and a refusal with below_margin fail; above it, nothing."""
    out, run = measured / "out", cli_runner("rehearsal")
    args = ["resources", "--provenance-root", str(measured / "provenance"), "--benchmarks",
            str(measured / "benchmarks"), "--margin", "1.5", "--config-name", "config/paper.yaml",
            "--out", str(out / "resources.csv"), "--markdown", str(out / "resources.md"),
            "--provenance", str(measured / "provenance/rehearsal/rehearsal_resources.md")]
    thin = {"export_model": {"mem_mb": 3500, "runtime": 60},
            "student_distill": {"mem_mb": 8000, "runtime": 60}}
    line = ("rule export_model: resources.export_model.mem_mb is 3500 in config/paper.yaml, 1.13 x its "
            "measured peak of 3100 MB, below the margin 1.5; raise it to 5000")
    capsys.readouterr()
    assert run(*args, "--below-margin", "warn", "--requests", json.dumps(thin)) == 0
    assert capsys.readouterr().err.splitlines() == [f"WARNING: {line}"]
    assert run(*args, "--below-margin", "fail", "--requests", json.dumps(thin)) == 2
    assert line in capsys.readouterr().err
    enough = {**thin, "export_model": {"mem_mb": 5000, "runtime": 60}}
    assert run(*args, "--below-margin", "fail", "--requests", json.dumps(enough)) == 0
    assert "WARNING" not in capsys.readouterr().err


@pytest.mark.parametrize("reset", [False, True])
def test_a_fragment_records_the_peak_resident_memory_of_its_command(tmp_path, reset):
    """A fresh process (about 30 MB) holds 400 MB for a moment, then writes its fragment; a reset of the
    kernel's high-water mark in between (writeback and retrieval measure their parts so) loses nothing."""
    script = (
        "import sys; from encoder_study import provenance; from encoder_study.core import machine\n"
        "block = bytearray(400_000_000)\n"  # zero-filled, so every page is touched
        "del block\n"
        + ("assert machine.reset_peak() and machine.peak_resident_kib() < 200_000\n" if reset else "")
        + "with provenance.Fragment(sys.argv[1], argv=['encoder-study']):\n    pass\n"
    )
    fragment = tmp_path / "provenance/x/x_rule.md"
    subprocess.run([sys.executable, "-c", script, str(fragment)], check=True)
    record = read_record(fragment.with_suffix(".json"))
    assert 400 <= record["peak_rss_mb"] < 600
    assert f"| peak resident memory (MB) | {record['peak_rss_mb']} |" in fragment.read_text(encoding="utf-8")


def test_a_command_does_not_report_the_peak_of_the_process_that_started_it(tmp_path):
    """Linux carries ru_maxrss over fork and exec: a command started by a process holding 600 MB (as
    pytest or Snakemake may) must still report its own peak, not its parent's."""
    script = (
        "import subprocess, sys\n"
        "block = bytearray(600_000_000)\n"
        "subprocess.run([sys.executable, '-c', 'from encoder_study.core import machine; "
        "print(machine.lifetime_peak_kib() // 1024)'], check=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert int(out) < 300


def test_scaled_down_rehearsal_runs_every_rule_of_the_study_and_measures_it(small_workflow):
    """config/rehearsal.yaml over config/paper.yaml, as the full rehearsal, with small architecture files and
    one tagging run of each kind (tests/data/rehearsal-small.yaml): the suite's shared run
    (conftest.small_workflow)."""
    copy = small_workflow
    rows = {
        r["rule"]: r
        for r in csv.DictReader((copy / "results/rehearsal/resources.csv").open(encoding="utf-8"))
    }
    for rule in (
        "export_model",
        "parity_compare",
        "tagging_train",
        "writeback_pipeline",
        "student_distill",
        "student_export",
        "retrieval_export",
        "rehearsal_streams",
    ):
        assert int(rows[rule]["peak_mb"]) > 0 and rows[rule]["peak_from"], rule
    assert rows["student_distill"]["mem_mb"] == str(PAPER["resources"]["student_distill"]["mem_mb"])
    # The stage read the stand-ins through the streaming reader, the student the staged corpus; the
    # retrieval graph is the twin's.
    stage = read_record(copy / "provenance/student/student_stage.json")
    read = {f["path"] for f in stage["files"] if f["role"] == "input"}
    assert "results/rehearsal/streams/HuggingFaceFW/fineweb-2/rus_Cyrl.jsonl" in read
    distill = read_record(copy / "provenance/student/student_distill.json")
    assert "results/student/corpus.jsonl" in {f["path"] for f in distill["files"] if f["role"] == "input"}
    retrieval = json.loads((copy / "results/retrieval/source/source.json").read_text(encoding="utf-8"))
    assert retrieval["source"] == {"kind": "tiny", "architecture": "config/models/xlmr-tiny.json", "seed": 0}
    exports = json.loads((copy / "results/models/mmbert-base/export.json").read_text(encoding="utf-8"))
    assert exports["source"] == {
        "kind": "tiny",
        "architecture": "config/models/modernbert-tiny.json",
        "seed": 0,
    }


def test_the_sparse_rows_compare_positive_weights_in_every_case(small_workflow):
    """The random sparse head's weights are positive (retrieval.heads.SPARSE_BIAS), so every case with a
    token the head does not ignore compares real numbers, not zeros with zeros; the case of special
    tokens alone (two a row) has none by construction."""
    rows = list(csv.DictReader((small_workflow / "results/retrieval/parity.csv").open(encoding="utf-8")))
    sparse = [r for r in rows if r["output"] == "sparse"]
    with_words = [r for r in sparse if int(r["tokens"]) > 2 * int(r["rows"])]
    assert len(with_words) >= 4 and len({r["case"] for r in with_words}) >= 2
    assert all(float(r["max_value"]) > 0 for r in with_words), with_words
    assert all(r["allclose"] == "True" for r in sparse)
