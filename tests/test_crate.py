"""The run's Workflow Run RO-Crate (encoder_study.crate): built from fragments the tests write with the
real Fragment writer, it passes roc-validator's Provenance Run Crate profile at the REQUIRED level
(offline: tests/crate_validation.py), lists every file of every fragment with its SHA-256, is the same
bytes twice, and refuses a tampered or missing fragment with a message naming the file and field."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from crate_validation import fill_cache, required_issues

from conftest import ROOT, runner
from encoder_study import crate, files, provenance

run = runner("provenance")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return fill_cache(tmp_path_factory.mktemp("http-cache") / "contexts")


def _job(fragment: str, inputs: list[str], outputs: dict[str, str], argv: list[str]) -> None:
    with provenance.Fragment(fragment, {"seed": 0}, threads=1, argv=argv) as frag:
        frag.inputs += inputs
        for path, text in outputs.items():
            files.write_text(path, text)
        frag.outputs += list(outputs)


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    """A tiny finished run: a workflow folder with three jobs of two rules and their fragments (the
    fragments record paths relative to the working directory, as the rules' do)."""
    monkeypatch.chdir(tmp_path)
    for name in ("Snakefile", "CITATION.cff", "LICENSE"):
        shutil.copy2(ROOT / name, tmp_path / name)
    files.write_text("config/words.txt", "alpha\nbeta\n")
    _job("provenance/demo/demo_make-a.md", ["config/words.txt"], {"results/a/words.txt": "alpha\n"},
         ["encoder-study", "demo", "make", "--name", "a"])
    _job("provenance/demo/demo_make-b.md", ["config/words.txt"], {"results/b/words.txt": "beta\n"},
         ["encoder-study", "demo", "make", "--name", "b"])
    _job("provenance/demo/demo_table.md", ["results/a/words.txt", "results/b/words.txt"],
         {"results/table.csv": "name,words\na,1\nb,1\n", "results/table.md": "| name | words |\n"},
         ["encoder-study", "demo", "table"])
    return tmp_path


FRAGMENTS = [
    "provenance/demo/demo_make-a.md", "provenance/demo/demo_make-b.md", "provenance/demo/demo_table.md"]


def _build(out: str = crate.CRATE_NAME) -> dict:
    assert run("crate", "--base", ".", "--workflow", "Snakefile", "--citation", "CITATION.cff",
               "--license", "LICENSE", "--out", out,
               "--provenance", "provenance/provenance/provenance_crate.md", *FRAGMENTS) == 0
    return json.loads(Path(out).read_text(encoding="utf-8"))


def _entities(built: dict) -> dict[str, dict]:
    return {e["@id"]: e for e in built["@graph"]}


def test_crate_passes_the_provenance_run_crate_profile(run_dir, cache):
    _build()
    assert required_issues(run_dir, cache) == []


def test_the_validator_catches_a_crate_that_breaks_the_profile(run_dir, cache):
    # The check above can fail: a job without its tool and a result missing from disk are errors.
    built = _build()
    for entity in built["@graph"]:
        if entity["@id"] == crate.local_id("job", "demo/demo_table"):
            del entity["instrument"]
    Path(crate.CRATE_NAME).write_text(json.dumps(built))
    Path("results/table.md").unlink()
    issues = "\n".join(required_issues(run_dir, cache))
    assert "results/table.md" in issues
    assert "provenance-run-crate" in issues or "process-run-crate" in issues


def test_every_file_of_every_fragment_is_listed_with_its_sha256(run_dir):
    built = _build()
    entities = _entities(built)
    listed = crate.files_of(built)
    for fragment in FRAGMENTS:
        record = provenance.read_record(provenance.twin(fragment))
        job = entities[crate.local_id("job", provenance.record_name(record))]
        assert job["@type"] == "CreateAction"
        assert job["instrument"] == {"@id": crate.local_id("tool", record["rule"])}
        assert job["startTime"] == record["started"] and job["endTime"] == record["finished"]
        for entry in record["files"]:
            entity = listed[entry["path"]]
            assert entity["sha256"] == entry["sha256"] == files.sha256_file(entry["path"])
            assert entity["contentSize"] == str(entry["bytes"])
            side = "result" if entry["role"] == "output" else "object"
            assert {"@id": entry["path"]} in job[side]
        # The fragment itself (Markdown and twin) is part of the crate, hashed as it is now.
        for part in (fragment, provenance.twin(fragment).as_posix()):
            assert {"@id": part} in job["subjectOf"] and listed[part]["sha256"] == files.sha256_file(part)
    root = entities["./"]
    assert {"@id": "results/table.csv"} in root["hasPart"] and root["mainEntity"] == {"@id": "Snakefile"}
    # The run: read config/words.txt, which no job wrote; left the table, which no job read.
    run_action = entities["#run"]
    assert run_action["object"] == [{"@id": "config/words.txt"}]
    assert run_action["result"] == [{"@id": "results/table.csv"}, {"@id": "results/table.md"}]
    steps = {s["@id"] for s in entities["Snakefile"]["step"]}
    assert steps == {crate.local_id("step", "demo_make"), crate.local_id("step", "demo_table")}
    snakemake = entities[crate.SNAKEMAKE_LANGUAGE]["version"]
    assert snakemake == provenance.library_versions(["snakemake"])["snakemake"]
    version = provenance.read_record(provenance.twin(FRAGMENTS[0]))["version"]
    assert entities["Snakefile"]["version"] == version
    # The crate's own fragment names the twins it read and the crate it wrote.
    own = provenance.read_record("provenance/provenance/provenance_crate.json")
    assert {f["path"] for f in own["files"] if f["role"] == "output"} == {crate.CRATE_NAME}
    assert {provenance.twin(f).as_posix() for f in FRAGMENTS} <= {f["path"] for f in own["files"]}


def test_same_fragments_give_the_same_bytes(run_dir):
    _build("first.json")
    _build("second.json")
    assert Path("first.json").read_bytes() == Path("second.json").read_bytes()


@pytest.mark.parametrize("edit, field", [
    (lambda r: r["files"][0].update(sha256="0" * 63), "files[0].sha256"),
    (lambda r: r.pop("started"), "started"),
    (lambda r: r["files"][1].update(bytes=-1), "files[1].bytes"),
    (lambda r: r.update(files=[]), "files"),
    (lambda r: r.pop("code"), "code"),
])
def test_a_tampered_fragment_is_named_with_its_field(run_dir, edit, field):
    twin = provenance.twin(FRAGMENTS[2])
    record = json.loads(twin.read_text())
    edit(record)
    twin.write_text(json.dumps(record))
    named = rf"{re.escape(str(twin))}: field '{re.escape(field)}'.*rerun the rule"
    with pytest.raises(crate.CrateError, match=named):
        _build()


def test_a_missing_twin_and_a_stale_fragment_are_refused(run_dir):
    provenance.twin(FRAGMENTS[0]).unlink()
    with pytest.raises(provenance.ProvenanceError, match=r"demo_make-a.json is missing: .*; rerun the rule"):
        _build()
    _job(FRAGMENTS[0], ["config/words.txt"], {"results/a/words.txt": "alpha, rewritten\n"},
         ["encoder-study", "demo", "make", "--name", "a"])
    # demo_table read the old words.txt: its fragment and the new one disagree on the file.
    with pytest.raises(crate.CrateError, match=r"results/a/words.txt with sha256 .* one fragment is stale"):
        _build()


def test_a_file_outside_the_crate_gets_a_local_id_and_stays_out_of_the_payload(run_dir, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "treebank.conllu"
    outside.write_text("# text = x\n")
    _job("provenance/demo/demo_read.md", [str(outside)], {"results/read.txt": "x\n"},
         ["encoder-study", "demo", "read"])
    FRAGMENTS.append("provenance/demo/demo_read.md")
    try:
        built = _build()
    finally:
        FRAGMENTS.pop()
    listed = {e["name"]: e for e in crate.files_of(built).values()}
    entity = listed[str(outside)]
    assert entity["@id"].startswith("#file-") and entity["sha256"] == files.sha256_file(outside)
    assert {"@id": entity["@id"]} not in _entities(built)["./"]["hasPart"]
