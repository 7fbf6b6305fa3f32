"""Provenance fragments, their join, and verify catching changed or missing files."""

import os
import time
from pathlib import Path

import pytest

from conftest import cli_runner
from encoder_study import provenance
from encoder_study.core import files, tables
from encoder_study.provenance.join import join
from encoder_study.provenance.records import read_record
from encoder_study.provenance.verify import FAST_CACHE, HashCache, environment_differences, verify

command = cli_runner("provenance")


def _fragment(tmp_path: Path) -> tuple[Path, Path, Path]:
    data = tmp_path / "results" / "table.csv"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("a,b\n1,2\n")
    inp = tmp_path / "config.json"
    inp.write_text("{}")
    frag = tmp_path / "provenance" / "demo" / "make_table-x.md"
    with provenance.Fragment(frag, {"seed": 3}, threads=2, argv=["encoder-study", "demo"]) as f:
        f.inputs.append(inp)
        f.outputs += [data, frag]  # the fragment itself is never hashed into itself
        f.table("Table", tables.markdown_table(["a", "b"], [(1, 2)]))
    return frag, inp, data


def test_fragment_records_files_settings_and_table(tmp_path):
    frag, inp, data = _fragment(tmp_path)
    text = frag.read_text()
    assert text.startswith("# make_table (x)\n")
    assert "| seed | 3 |" in text and "| recipe | demo |" in text and "## Table" in text
    assert "| command | `encoder-study demo` |" in text
    record = read_record(provenance.twin(frag))
    rows = [(f["role"], f["path"], f["bytes"], f["sha256"]) for f in record["files"]]
    assert [(r[0], r[1]) for r in rows] == [("input", inp.as_posix()), ("output", data.as_posix())]
    assert rows[1][3] == files.sha256_file(data) and rows[1][2] == data.stat().st_size


def test_fragments_record_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5, 7}, raising=False)  # e.g. a Slurm job
    assert provenance.machine()["cores"] == "3"


def test_verify_passes_then_names_a_changed_and_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --base .: not the checkout, whose finished run has a crate of its own
    frag, inp, data = _fragment(tmp_path)
    root = tmp_path / "provenance"
    assert verify(root, ".") == []
    assert command("verify", "--root", str(root), "--base", ".") == 0
    data.write_text("a,b\n1,3\n")
    inp.unlink()
    problems = verify(root, ".")
    assert len(problems) == 2
    assert any(str(data) in p and "changed" in p for p in problems)
    assert any(str(inp) in p and "missing" in p for p in problems)
    assert command("verify", "--root", str(root), "--base", ".") == 1


def test_verify_without_fragments_fails(tmp_path):
    assert verify(tmp_path, ".") and command("verify", "--root", str(tmp_path), "--base", ".") == 1


def test_failed_work_writes_no_fragment(tmp_path):
    frag = tmp_path / "p" / "r" / "rule.md"
    try:
        with provenance.Fragment(frag):
            raise ValueError("boom")
    except ValueError:
        pass
    assert not frag.exists()


def test_join_keeps_the_given_order_and_demotes_headings(tmp_path):
    a, b = tmp_path / "b_first.md", tmp_path / "a_second.md"
    a.write_text("# first\n\n## Files\n")
    b.write_text("# second\n")
    out = tmp_path / "PROVENANCE.md"
    join("demo", [a, b], out)
    text = out.read_text()
    assert text.index("## first") < text.index("## second") and "### Files" in text
    assert text.startswith("# Provenance of the `demo` recipe")
    again = tmp_path / "again.md"
    assert command("join", "--recipe", "demo", "--out", str(again), str(a), str(b)) == 0
    assert again.read_text() == text


def test_tree_sha256_is_the_documented_recipe(tmp_path):
    import hashlib

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("b")
    (tmp_path / "d" / "sub" / "a.txt").write_text("a")
    lines = "".join(f"{files.sha256_file(tmp_path / 'd' / p)}  {p}\n" for p in ["b.txt", "sub/a.txt"])
    assert files.tree_sha256(tmp_path / "d") == hashlib.sha256(lines.encode()).hexdigest()


def test_write_torch_gives_bytes_that_depend_on_the_object_alone(tmp_path):
    """torch.save names its archive after the file; written through files.write_torch, equal objects
    give equal files whatever their paths (the distilled student's SHA-256 is in its export.json)."""
    import torch

    record = {"weights": torch.arange(6, dtype=torch.float32).reshape(2, 3), "steps": 3}
    files.write_torch(tmp_path / "a.pt", record)
    files.write_torch(tmp_path / "sub" / "other-name.pt", record)
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "sub" / "other-name.pt").read_bytes()
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["weights"], record["weights"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "sub"]  # no temporary file left


# -- JSON twins, verify on the twins, verify --env ------------------------------------------------

def test_twin_states_the_same_facts_as_the_markdown(tmp_path):
    import json

    import encoder_study

    frag, inp, data = _fragment(tmp_path)
    record = json.loads(provenance.twin(frag).read_text())
    text = frag.read_text()
    assert record["format"] == provenance.RECORD_FORMAT
    assert (record["rule"], record["recipe"], record["wildcards"]) == ("make_table", "demo", "x")
    assert record["command"] == "encoder-study demo" and record["settings"] == {"seed": 3}
    assert record["version"] == encoder_study.__version__
    assert f"| encoder-study version | {encoder_study.__version__} |" in text
    assert set(record["code"]) == {"commit", "dirty", "changed_files"}
    assert record["machine"]["python"] and record["libraries"]["numpy"] != "not installed"
    assert record["started"] <= record["finished"] and record["threads"] == 2
    rows = [(f["role"], f["path"], f["bytes"], f["sha256"]) for f in record["files"]]
    assert rows[1][3] == files.sha256_file(data)
    assert record["tables"][0]["title"] == "Table" and record["tables"][0]["markdown"] in text
    assert record["markdown"]["sha256"] == files.sha256_file(frag)
    assert provenance.render({k: v for k, v in record.items() if k != "markdown"}) == text


def test_extra_sections_of_a_record_appear_in_the_markdown(tmp_path):
    """A mapping the renderer does not know (the device, say) gets a section of its own."""
    frag, _, _ = _fragment(tmp_path)
    record = read_record(provenance.twin(frag))
    record["device"] = {"gpu": "none", "execution provider": "CPUExecutionProvider"}
    text = provenance.render(record)
    assert "## Device\n" in text and "| execution provider | CPUExecutionProvider |" in text


def test_verify_reads_the_twin_not_the_markdown(tmp_path):
    import json

    frag, _, data = _fragment(tmp_path)
    root = tmp_path / "provenance"
    twin = provenance.twin(frag)
    record = json.loads(twin.read_text())
    record["files"][1]["sha256"] = "0" * 64  # only the twin changes: the Markdown still matches the data
    twin.write_text(json.dumps(record))
    problems = verify(root, ".")
    assert len(problems) == 1 and str(data) in problems[0] and "0" * 64 in problems[0]


def test_verify_names_a_missing_twin_a_missing_markdown_and_an_edited_markdown(tmp_path):
    frag, _, _ = _fragment(tmp_path)
    root = tmp_path / "provenance"
    frag.write_text(frag.read_text().replace("| seed | 3 |", "| seed | 4 |"))
    assert ["differs from the Markdown" in p for p in verify(root, ".")] == [True]
    provenance.twin(frag).unlink()
    assert ["no JSON twin" in p for p in verify(root, ".")] == [True]
    frag2, _, _ = _fragment(tmp_path)  # both again, then the Markdown goes
    frag2.unlink()
    problems = verify(root, ".")
    assert ["Markdown fragment make_table-x.md is missing" in p for p in problems] == [True]


def test_a_broken_twin_is_a_user_error_and_other_json_is_skipped(tmp_path):
    frag, _, _ = _fragment(tmp_path)
    root = tmp_path / "provenance"
    (root / "ro-crate-metadata.json").write_text('{"@context": "x"}')  # not a twin: skipped
    assert verify(root, ".") == []
    provenance.twin(frag).write_text("{not json")
    problems = verify(root, ".")
    assert len(problems) == 1 and "cannot read" in problems[0] and "make_table-x.json" in problems[0]


def test_environment_differences_name_each_package_and_python(tmp_path):
    frag, _, _ = _fragment(tmp_path)
    record = read_record(provenance.twin(frag))
    record["libraries"] = {"numpy": "1.0.0", "torch": "2.13.0"}
    record["machine"]["python"] = "3.11.0"
    del record["environment"]  # the short list alone (tests/test_lineage.py: the complete environment)
    lines = environment_differences([record], installed={"numpy": "2.0.0", "torch": "2.13.0"},
                                               python="3.12.1")
    assert lines == [
        "numpy: recorded 1.0.0 by 1 fragment(s) (e.g. demo/make_table-x), installed now 2.0.0",
        "python: recorded 3.11.0 by 1 fragment(s) (e.g. demo/make_table-x), installed now 3.12.1",
    ]
    assert environment_differences([record], installed={"numpy": "1.0.0", "torch": "2.13.0"},
                                              python="3.11.0") == []


def test_verify_env_passes_on_this_environment_and_fails_on_an_edited_record(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)  # --base .: not the checkout, whose finished run has a crate of its own
    frag, _, _ = _fragment(tmp_path)
    root = tmp_path / "provenance"
    assert command("verify", "--root", str(root), "--base", ".", "--env") == 0
    twin = provenance.twin(frag)
    record = json.loads(twin.read_text())
    record["libraries"]["numpy"] = "0.0.1"
    twin.write_text(json.dumps(record))
    capsys.readouterr()
    assert command("verify", "--root", str(root), "--base", ".") == 0  # hashes alone still match
    assert command("verify", "--root", str(root), "--base", ".", "--env") == 1
    assert "numpy: recorded 0.0.1 by 1 fragment(s)" in capsys.readouterr().err


# -- explain ----------------------------------------------------------------------------------------

def _job(path: str, inputs: list[str], outputs: dict[str, str], argv: list[str]) -> None:
    for name, text in outputs.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(text)
    with provenance.Fragment(path, {"what": argv[-1]}, argv=["encoder-study", *argv]) as frag:
        frag.inputs += inputs
        frag.outputs += list(outputs)


def _study(tmp_path, monkeypatch):
    """A small chain with relative paths, as the workflow records them: a tiny model's architecture ->
    acquire -> export -> two tagging runs -> a scores table with a row per run and split."""
    monkeypatch.chdir(tmp_path)
    Path("config/models").mkdir(parents=True)
    Path("config/models/m.json").write_text('{"layers": 2}')
    _job("provenance/tagging/tagging_treebank.md", [],
         {"results/treebank/dev.conllu": "dev\n", "results/treebank/test.conllu": "test\n"}, ["treebank"])
    _job("provenance/export/export_acquire-m.md", ["config/models/m.json"],
         {"results/sources/m/source.json": "{}"}, ["export", "acquire"])
    _job("provenance/export/export_model-m.md", ["results/sources/m/source.json"],
         {"results/models/m/model.onnx": "onnx"}, ["export", "model"])
    preds = []
    for run in ("m-frozen", "m-finetuned"):
        outs = {f"results/tagging/{run}/{s}.pred.conllu": f"{run} {s}\n" for s in ("dev", "test")}
        outs[f"results/tagging/{run}/run.json"] = "{}"
        _job(f"provenance/tagging/tagging_train-{run}.md",
             ["results/models/m/model.onnx", "results/treebank/dev.conllu", "results/treebank/test.conllu"],
             outs, ["tagging", "train", run])
        preds += list(outs)
    scores = "run,encoder,split,upos\n" + "".join(
        f"{run},m,{split},{90 + i}.5\n" for i, (run, split) in enumerate(
            [("m-finetuned", "dev"), ("m-finetuned", "test"), ("m-frozen", "dev"), ("m-frozen", "test")]))
    _job("provenance/tagging/tagging_tables.md",
         [*preds, "results/treebank/dev.conllu", "results/treebank/test.conllu"],
         {"results/tagging/scores.csv": scores}, ["tagging", "tables"])


def test_explain_a_row_follows_its_run_and_split_back_to_the_sources(tmp_path, monkeypatch, capsys):
    _study(tmp_path, monkeypatch)
    assert command("explain", "results/tagging/scores.csv", "--row", "m-finetuned,test") == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("results/tagging/scores.csv")
    assert files.sha256_file("results/tagging/scores.csv") in first
    assert "(matches the record)" in first
    assert "row: run=m-finetuned, encoder=m, split=test, upos=91.5" in out
    assert "made by tagging/tagging_tables" in out and "inputs for this row: 3 of 8" in out
    # The row's own predictions and split; not the other run's, nor the dev predictions of this run.
    table_inputs = [line.split()[1] for line in out.splitlines() if line.startswith("    - ")]
    assert table_inputs == ["results/tagging/m-finetuned/test.pred.conllu",
                            "results/tagging/m-finetuned/run.json", "results/treebank/test.conllu"]
    assert "m-frozen" not in out and "m-finetuned/dev.pred.conllu" not in out
    # Back to the model source (the architecture file, a source no job made) and the treebank.
    for name in ("tagging/tagging_train-m-finetuned", "export/export_model-m", "export/export_acquire-m",
                 "tagging/tagging_treebank"):
        assert f"made by {name}" in out
    assert f"config/models/m.json  13 bytes  sha256 {files.sha256_file('config/models/m.json')}" in out
    assert "a source: no job made it" in out
    assert "command: encoder-study export model" in out


def test_explain_says_when_a_file_changed_and_refuses_unknown_files_and_rows(tmp_path, monkeypatch, capsys):
    _study(tmp_path, monkeypatch)
    Path("results/models/m/model.onnx").write_text("other")
    assert command("explain", "results/models/m/model.onnx") == 1  # a changed file fails, as in verify
    assert "CHANGED since: now" in capsys.readouterr().out
    assert command("explain", "results/nothing.csv") == 2
    assert "no fragment under provenance names it as an output" in capsys.readouterr().err
    assert command("explain", "results/tagging/scores.csv", "--row", "m-finetuned") == 2
    err = capsys.readouterr().err
    assert "2 rows match --row m-finetuned" in err and "m-finetuned,m,dev" in err
    assert command("explain", "results/tagging/scores.csv", "--row", "test,m-finetuned") == 2  # column order
    assert "no row match" in capsys.readouterr().err


def test_explain_without_twins_is_a_user_error(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    assert command("explain", "x.csv", "--root", str(tmp_path / "p")) == 2
    assert "no provenance fragments with JSON twins" in capsys.readouterr().err


# -- verify --fast: hashes kept by file state ----------------------------------------------------------

def _fast(root: Path, cache_path: Path) -> tuple[list[str], HashCache]:
    cache = HashCache(cache_path)
    problems = verify(root, ".", cache=cache)
    cache.save()
    return problems, cache


@pytest.fixture
def settled(monkeypatch):
    """Files written a moment ago count as settled (the cache skips files changed within RACY_NS)."""
    monkeypatch.setattr("encoder_study.provenance.verify.RACY_NS", -10**15)


def _same_size_edit(path: Path, keep_times: bool) -> None:
    before = path.stat()
    text = path.read_text()
    path.write_text(text[:-2] + ("9" if text[-2] != "9" else "8") + text[-1])
    if keep_times:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


def test_fast_verify_hashes_once_then_trusts_an_unchanged_state(tmp_path, settled):
    _fragment(tmp_path)
    root, cache_path = tmp_path / "provenance", tmp_path / "cache.json"
    problems, first = _fast(root, cache_path)
    assert problems == [] and (first.hashed, first.hits) == (2, 0)
    problems, second = _fast(root, cache_path)
    assert problems == [] and (second.hashed, second.hits) == (0, 2)


@pytest.mark.parametrize("change", ["other size", "same size", "same size and mtime", "new inode"])
def test_fast_verify_hashes_again_a_file_whose_state_changed(tmp_path, settled, change):
    frag, inp, data = _fragment(tmp_path)
    root, cache_path = tmp_path / "provenance", tmp_path / "cache.json"
    assert _fast(root, cache_path)[0] == []
    if change == "other size":
        data.write_text("a,b\n1,22\n")
    elif change == "new inode":  # the same bytes and times in a new file (a copy moved over it)
        copy = data.with_name("copy")
        copy.write_bytes(data.read_bytes())
        os.utime(copy, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns))
        os.replace(copy, data)
    else:  # mtime set back: ctime, which no call can set back, still moves
        _same_size_edit(data, keep_times=change == "same size and mtime")
    problems, cache = _fast(root, cache_path)
    assert (cache.hashed, cache.hits) == (1, 1)
    if change == "new inode":
        assert problems == []
    else:
        assert len(problems) == 1 and str(data) in problems[0] and "changed" in problems[0]


def test_full_verify_never_reads_the_cache(tmp_path, settled):
    """A change the cache cannot see (here: its entry made to match the changed file) passes --fast, and
    the default verify, which reads every file, still names it."""
    import json

    frag, inp, data = _fragment(tmp_path)
    root, cache_path = tmp_path / "provenance", tmp_path / "cache.json"
    assert _fast(root, cache_path)[0] == []
    recorded = files.sha256_file(data)
    _same_size_edit(data, keep_times=True)
    stat = data.stat()
    entries = json.loads(cache_path.read_text())
    entries["files"][os.path.realpath(data)] = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino,
                                                stat.st_dev, recorded]
    cache_path.write_text(json.dumps(entries))
    assert _fast(root, cache_path)[0] == []  # what --fast trusts
    problems = verify(root, ".")
    assert len(problems) == 1 and str(data) in problems[0] and "changed" in problems[0]


def test_fast_verify_does_not_keep_a_file_changed_just_before_it_was_hashed(tmp_path):
    _fragment(tmp_path)  # written now: within RACY_NS
    root, cache_path = tmp_path / "provenance", tmp_path / "cache.json"
    assert _fast(root, cache_path)[0] == []
    problems, again = _fast(root, cache_path)
    assert problems == [] and (again.hashed, again.hits) == (2, 0)


def test_fast_verify_command_keeps_its_cache_under_base(tmp_path, settled, monkeypatch, capsys):
    _fragment(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert command("verify", "--root", "provenance", "--base", ".", "--fast") == 0
    assert (tmp_path / FAST_CACHE).is_file()
    assert command("verify", "--root", "provenance", "--base", ".", "--fast") == 0
    assert "--fast: 2 file(s) not read again" in capsys.readouterr().out
    (tmp_path / FAST_CACHE).write_text("{damaged")  # a damaged cache: every file read
    assert command("verify", "--root", "provenance", "--base", ".", "--fast") == 0
    assert "--fast: 0 file(s) not read again" in capsys.readouterr().out


def test_a_file_named_by_many_fragments_is_read_once(tmp_path, monkeypatch):
    _fragment(tmp_path)
    read = []
    sha256_file = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda path: read.append(Path(path).name) or sha256_file(path))
    assert verify(tmp_path / "provenance", ".") == []
    once = len(read)
    second = tmp_path / "provenance" / "demo" / "make_table-y.md"
    with provenance.Fragment(second, {}, threads=1, argv=["encoder-study", "demo"]) as f:
        f.inputs.append(tmp_path / "config.json")
        f.outputs.append(tmp_path / "results" / "table.csv")
    read.clear()
    assert verify(tmp_path / "provenance", ".") == []
    assert read.count("table.csv") == 1 and read.count("config.json") == 1 and len(read) == once + 1


# -- version ------------------------------------------------------------------------------------------

def test_package_version_is_pyprojects_and_the_changelogs_latest():
    import re
    import tomllib

    import encoder_study

    repo = Path(__file__).resolve().parents[1]
    project = tomllib.loads((repo / "workflow" / "lib" / "pyproject.toml").read_text())["project"]
    assert project["version"] == encoder_study.__version__
    # Fragments record both; a stale install (pip install -e workflow/lib not rerun) would disagree.
    from importlib import metadata

    installed = metadata.version("encoder-study")
    assert installed == encoder_study.__version__, "reinstall: pip install -e workflow/lib"
    latest = re.search(r"^## \[?(\d+\.\d+\.\d+)", (repo / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert latest and latest[1] == encoder_study.__version__


def test_a_reader_of_a_rewritten_fragment_is_named_stale(tmp_path):
    """The run crate reads every fragment: rerunning one rule alone leaves it stale, and verify says so."""
    frag, _, _ = _fragment(tmp_path)
    reader = tmp_path / "provenance" / "provenance" / "provenance_crate.md"
    with provenance.Fragment(reader, {}, threads=1, argv=["encoder-study", "crate"]) as f:
        f.inputs.append(provenance.twin(frag))
        f.outputs.append(reader)
    root = tmp_path / "provenance"
    assert verify(root, ".") == []
    time.sleep(1.1)  # fragments record their times to the second
    _fragment(tmp_path)  # the rule ran again: same table, a new fragment (its times)
    problems = verify(root, ".")
    assert len(problems) == 1 and "provenance_crate.json" in problems[0]
    assert "rewritten by a later run of its rule" in problems[0]
    assert "`all` rebuilds the run crate" in problems[0]


def test_an_edited_joined_provenance_is_changed_since_the_run_not_rewritten(tmp_path):
    """The crate reads each recipe's PROVENANCE.md: one edited by hand is named as changed since the run,
    not as rewritten by a later run of its rule (which a joined file has not: join is no fragment)."""
    frag, _, _ = _fragment(tmp_path)
    root = tmp_path / "provenance"
    joined = root / "x" / "PROVENANCE.md"
    join(frag.parent.name, [frag], joined)
    reader = root / "provenance" / "provenance_crate.md"
    with provenance.Fragment(reader, {}, threads=1, argv=["encoder-study", "crate"]) as f:
        f.inputs.append(joined)
        f.outputs.append(reader)
    assert verify(root, ".") == []
    joined.write_text(joined.read_text(encoding="utf-8") + "an edit\n", encoding="utf-8")
    problems = verify(root, ".")
    assert len(problems) == 1 and "PROVENANCE.md changed since the run (edited" in problems[0]
    assert "rewritten by a later run" not in problems[0]
