"""explain re-hashing its chain, the row checks of explain and verify, the complete environment and
`verify --env`, and what a fragment records as its inputs (checked files, paths without `..`)."""

import json
from pathlib import Path

import pytest

from conftest import cli_runner
from encoder_study import provenance
from encoder_study.core import files
from encoder_study.provenance.records import read_record

command = cli_runner("provenance")
export_command = cli_runner("export")

# A gold split of two sentences (5 words) and two runs' predictions of it: 4 and 3 words right, so
# UPOS 80.0 and 60.0 and a difference of 20.0 points (counted by hand).
GOLD = [[("The", "DET"), ("duck", "NOUN"), ("swims", "VERB")], [("She", "PRON"), ("sings", "VERB")]]
PREDICTED = {"m-finetuned": ["DET", "NOUN", "NOUN", "PRON", "VERB"],
             "m-frozen": ["DET", "VERB", "NOUN", "PRON", "VERB"]}
SCORES_HEADER = "run,encoder,split,upos,ci_low,ci_high,tokens,sentences\n"
SCORES = {"m-finetuned": "m-finetuned,m,test,80.0,70.0,90.0,5,2\n",
          "m-frozen": "m-frozen,m,test,60.0,50.0,70.0,5,2\n"}
COMPARISONS = "a,b,diff,ci_low,ci_high,split,upos_a,upos_b,tokens,sentences\n" \
              "m-finetuned,m-frozen,20.0,10.0,30.0,test,80.0,60.0,5,2\n"


def _conllu(tags: list[str] | None = None) -> str:
    """The gold split as CoNLL-U, its UPOS column replaced by `tags` (one per word) when given."""
    tags = iter(tags) if tags is not None else None
    blocks = []
    for i, sentence in enumerate(GOLD, 1):
        rows = [f"{k}\t{form}\t{form.lower()}\t{next(tags) if tags else upos}\t_\t_\t0\tdep\t_\t_"
                for k, (form, upos) in enumerate(sentence, 1)]
        text = " ".join(form for form, _ in sentence)
        blocks.append(f"# sent_id = test-{i}\n# text = {text}\n" + "\n".join(rows) + "\n")
    return "\n".join(blocks) + "\n"


def _job(path: str, inputs: list[str], outputs: dict[str, str | bytes], argv: list[str]) -> None:
    for name, data in outputs.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_bytes(data if isinstance(data, bytes) else data.encode())
    with provenance.Fragment(path, {"what": argv[-1]}, argv=["encoder-study", *argv]) as frag:
        frag.inputs += inputs
        frag.outputs += list(outputs)


def _chain(tmp_path, monkeypatch) -> None:
    """treebank -> export -> two tagging runs -> the tables (scores and comparisons), relative paths."""
    monkeypatch.chdir(tmp_path)
    _job("provenance/tagging/tagging_treebank.md", [], {"results/treebank/test.conllu": _conllu()},
         ["treebank"])
    _job("provenance/export/export_model-m.md", [], {"results/models/m/model.onnx": bytes(range(64))},
         ["export", "model"])
    preds = []
    for run, tags in PREDICTED.items():
        outs = {f"results/tagging/{run}/test.pred.conllu": _conllu(tags),
                f"results/tagging/{run}/scores.csv": SCORES_HEADER + SCORES[run]}
        _job(f"provenance/tagging/tagging_train-{run}.md",
             ["results/models/m/model.onnx", "results/treebank/test.conllu"], outs, ["tagging", "train", run])
        preds += list(outs)
    _job("provenance/tagging/tagging_tables.md", [*preds, "results/treebank/test.conllu"],
         {"results/tagging/scores.csv": SCORES_HEADER + "".join(SCORES.values()),
          "results/tagging/comparisons.csv": COMPARISONS}, ["tagging", "tables"])


def _line(out: str, path: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith(f"- {path} "))


def _edit_consistently(path: str, old: str, new: str) -> None:
    """Edit a table and its producer's recorded hash, so that verify's hashes alone still match."""
    before = files.sha256_file(path)
    Path(path).write_text(Path(path).read_text().replace(old, new))
    for twin in Path("provenance").rglob("*.json"):
        if before in twin.read_text():
            twin.write_text(twin.read_text().replace(before, files.sha256_file(path)))


# -- explain hashes every file it prints --------------------------------------------------------------

def test_explain_marks_a_flipped_model_byte_in_a_comparisons_chain(tmp_path, monkeypatch, capsys):
    _chain(tmp_path, monkeypatch)
    row = ("explain", "results/tagging/comparisons.csv", "--row", "m-finetuned,m-frozen,test")
    assert command(*row) == 0
    out = capsys.readouterr().out
    recorded = files.sha256_file("results/models/m/model.onnx")
    assert _line(out, "results/models/m/model.onnx").endswith(f"sha256 {recorded}  (matches)")
    assert "check: " in out and "every one matches" in out

    model = Path("results/models/m/model.onnx")
    data = bytearray(model.read_bytes())
    data[17] ^= 0x01
    model.write_bytes(bytes(data))
    now = files.sha256_file(model)
    assert command(*row) == 1
    captured = capsys.readouterr()
    line = _line(captured.out, "results/models/m/model.onnx")
    assert line.endswith(f"sha256 {recorded}  (CHANGED since: now {now} (64 bytes))")
    assert "(matches)" not in line
    # Each run's job read the model: the file is hashed once and named once among the problems.
    assert [p for p in captured.err.splitlines() if "model.onnx" in p] == [
        f"  results/models/m/model.onnx: CHANGED since: now {now} (64 bytes); "
        f"tagging/tagging_train-m-finetuned recorded sha256 {recorded} (64 bytes)"]
    assert _line(captured.out, "results/treebank/test.conllu").endswith("(matches)")


def test_explain_marks_a_missing_file_of_the_chain(tmp_path, monkeypatch, capsys):
    _chain(tmp_path, monkeypatch)
    Path("results/tagging/m-frozen/test.pred.conllu").unlink()
    assert command("explain", "results/tagging/scores.csv", "--row", "m-frozen,test") == 1
    captured = capsys.readouterr()
    assert _line(captured.out, "results/tagging/m-frozen/test.pred.conllu").endswith("(MISSING now)")
    assert "results/tagging/m-frozen/test.pred.conllu: MISSING now" in captured.err


# -- rows: inside their intervals, as their predictions give -----------------------------------------------

def test_a_score_edited_outside_its_interval_is_named_by_explain_and_verify(tmp_path, monkeypatch, capsys):
    _chain(tmp_path, monkeypatch)
    assert command("explain", "results/tagging/scores.csv", "--row", "m-finetuned,test") == 0
    out = capsys.readouterr().out
    assert "row check: upos 80.0 lies inside its interval [70.0, 90.0]" in out
    assert ("row check: upos, tokens and sentences are what results/tagging/m-finetuned/test.pred.conllu "
            "against results/treebank/test.conllu gives") in out
    assert command("verify", "--root", "provenance", "--base", ".") == 0
    capsys.readouterr()

    _edit_consistently("results/tagging/scores.csv", "m-finetuned,m,test,80.0,", "m-finetuned,m,test,95.5,")
    assert command("explain", "results/tagging/scores.csv", "--row", "m-finetuned,test") == 1
    captured = capsys.readouterr()
    assert "(matches the record)" in captured.out.splitlines()[0]  # the hashes alone see nothing
    assert "row check FAILED: upos 95.5 lies outside its own interval [70.0, 90.0]" in captured.out
    assert ("results/tagging/scores.csv row m-finetuned,m,test: upos 95.5 but "
            "results/tagging/m-finetuned/test.pred.conllu against results/treebank/test.conllu gives 80.0 "
            "(4 of 5 tokens right)") in captured.err
    # The whole table, and verify, name the row too.
    assert command("explain", "results/tagging/scores.csv") == 1
    assert "row m-finetuned,m,test: upos 95.5 lies outside its own interval" in capsys.readouterr().err
    assert command("verify", "--root", "provenance", "--base", ".") == 1
    err = capsys.readouterr().err
    assert "results/tagging/scores.csv row m-finetuned,m,test: upos 95.5 lies outside its own interval" in err
    assert "m-frozen" not in err


def test_counts_and_a_difference_unlike_the_predictions_are_named(tmp_path, monkeypatch, capsys):
    _chain(tmp_path, monkeypatch)
    _edit_consistently("results/tagging/m-frozen/scores.csv", "70.0,5,2", "70.0,6,3")
    _edit_consistently("results/tagging/comparisons.csv", "20.0,10.0,30.0", "21.0,10.0,30.0")
    assert command("verify", "--root", "provenance", "--base", ".") == 1
    err = capsys.readouterr().err
    source = "results/tagging/m-frozen/test.pred.conllu against results/treebank/test.conllu"
    assert f"results/tagging/m-frozen/scores.csv row m-frozen,m,test: tokens 6 but {source} gives 5" in err
    assert f"results/tagging/m-frozen/scores.csv row m-frozen,m,test: sentences 3 but {source} gives 2" in err
    assert ("results/tagging/comparisons.csv row m-finetuned,m-frozen,test: diff 21.0 but the two runs' "
            "predictions give 20.0") in err
    assert "lies outside" not in err  # both edits stay inside their intervals
    assert command("explain", "results/tagging/comparisons.csv", "--row", "m-finetuned,m-frozen") == 1


def test_predictions_that_do_not_align_with_the_gold_are_named(tmp_path, monkeypatch, capsys):
    _chain(tmp_path, monkeypatch)
    pred = "results/tagging/m-frozen/test.pred.conllu"
    text = Path(pred).read_text()
    _edit_consistently(pred, text, text.split("\n\n")[0] + "\n\n")  # the second sentence dropped
    assert command("explain", "results/tagging/scores.csv", "--row", "m-frozen,test") == 1
    assert f"{pred} does not have the words of results/treebank/test.conllu" in capsys.readouterr().err


# -- the complete environment --------------------------------------------------------------------------

def _fragment(tmp_path: Path) -> Path:
    data = tmp_path / "results" / "table.csv"
    data.parent.mkdir(parents=True)
    data.write_text("a\n1\n")
    frag = tmp_path / "provenance" / "demo" / "make_table.md"
    with provenance.Fragment(frag, argv=["encoder-study", "demo"]) as f:
        f.outputs.append(data)
    return frag


def test_a_fragment_names_one_file_with_every_installed_distribution(tmp_path):
    from importlib import metadata

    frag = _fragment(tmp_path)
    record = read_record(provenance.twin(frag))
    entry = record["environment"]
    path = Path(entry["path"])
    assert path.parent == tmp_path / "provenance" / "environments" and path.name == f"{entry['sha256']}.json"
    assert files.sha256_file(path) == entry["sha256"]
    recorded = json.loads(path.read_text())
    # Every distribution importlib.metadata lists, whatever the spelling of its name.
    installed = {d.metadata["Name"].lower().replace("_", "-").replace(".", "-"): d.version
                 for d in reversed(list(metadata.distributions()))}
    assert recorded["distributions"] == installed and entry["distributions"] == len(installed)
    assert recorded["distributions"]["numpy"] == metadata.version("numpy")
    assert "torch" in record["libraries"] and len(record["libraries"]) < 20  # the short list stays
    assert "## Environment" in frag.read_text() and entry["sha256"] in frag.read_text()
    # A second fragment in the same environment names the same file.
    again = tmp_path / "provenance" / "demo" / "other.md"
    with provenance.Fragment(again, argv=["encoder-study", "demo"]) as f:
        f.outputs.append(tmp_path / "results" / "table.csv")
    assert read_record(provenance.twin(again))["environment"] == entry
    assert len(list(path.parent.iterdir())) == 1


def test_verify_env_compares_every_distribution(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # --base .: not the checkout, whose finished run has a crate of its own
    frag = _fragment(tmp_path)
    root = str(tmp_path / "provenance")
    assert command("verify", "--root", root, "--base", ".", "--env") == 0
    capsys.readouterr()
    entry = read_record(provenance.twin(frag))["environment"]
    recorded = json.loads(Path(entry["path"]).read_text())
    assert "pluggy" in recorded["distributions"]  # not in the short list: only the complete one has it
    now = dict(recorded["distributions"], pluggy="0.0.1", extra_package="1.0")
    del now["iniconfig"]
    monkeypatch.setattr("encoder_study.provenance.verify.distributions", lambda: now)
    assert command("verify", "--root", root, "--base", ".") == 0  # hashes alone still match
    assert command("verify", "--root", root, "--base", ".", "--env") == 1
    err = capsys.readouterr().err
    where = f"in {tmp_path}/provenance/environments/"
    assert f"pluggy: recorded {recorded['distributions']['pluggy']} {where}" in err
    assert "(1 fragment(s), e.g. demo/make_table), installed now 0.0.1" in err
    assert f"iniconfig: recorded {recorded['distributions']['iniconfig']} {where}" in err
    assert "not installed now" in err
    assert "extra_package: installed now 1.0, not in the environment recorded" in err
    assert len([line for line in err.splitlines() if line.startswith("  ")]) == 3


def test_verify_names_an_edited_environment_file(tmp_path, capsys):
    frag = _fragment(tmp_path)
    path = Path(read_record(provenance.twin(frag))["environment"]["path"])
    path.write_text(path.read_text().replace('"numpy"', '"numpy-other"'))
    assert command("verify", "--root", str(tmp_path / "provenance"), "--base", ".") == 1
    assert f"its environment file {path} changed" in capsys.readouterr().err
    path.unlink()
    assert command("verify", "--root", str(tmp_path / "provenance"), "--base", ".") == 1
    assert f"its environment file {path} is missing" in capsys.readouterr().err


# -- what a fragment records as its inputs -----------------------------------------------------------------

def test_paths_are_recorded_without_dot_dot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = Path("results/models/m/model.onnx")
    model.parent.mkdir(parents=True)
    model.write_bytes(b"onnx")
    Path("results/tagging/run").mkdir(parents=True)
    Path("elsewhere/deep").mkdir(parents=True)
    Path("results/link").symlink_to(Path("elsewhere/deep").resolve())
    Path("elsewhere/f.txt").write_text("f")
    out = Path("results/tagging/run/out.txt")
    out.write_text("out")
    with provenance.Fragment("provenance/writeback/job.md", argv=["encoder-study"]) as frag:
        frag.inputs += ["results/tagging/run/../../models/m/model.onnx", "results/link/../f.txt"]
        frag.outputs.append("results/tagging/run/../run/out.txt")
    record = read_record("provenance/writeback/job.json")
    # `link/..` is the link's target's parent, not results/: the real path is recorded.
    assert [(e["role"], e["path"]) for e in record["files"]] == [
        ("input", "results/models/m/model.onnx"), ("input", "elsewhere/f.txt"),
        ("output", "results/tagging/run/out.txt")]


def test_a_file_the_job_checks_against_a_hash_is_an_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("src").mkdir()
    weights, written = Path("src/weights.bin"), Path("out.bin")
    weights.write_bytes(b"w" * 10)
    files.check_file("src/../src/weights.bin", files.sha256_file(weights))  # before the job: not its input
    with provenance.Fragment("provenance/r/job.md", argv=["encoder-study"]) as frag:
        frag.inputs.append("src/weights.bin")  # named too: listed once
        files.check_file("src/../src/weights.bin", files.sha256_file(weights))
        written.write_bytes(b"o")
        files.check_file(written, files.sha256_file(written))  # its own output: not an input
        frag.outputs.append(written)
    with pytest.raises(files.IntegrityError):
        files.check_file(weights, "0" * 64)
    assert files.CHECKED == {weights: None}  # a later job starts afresh at its fragment
    record = read_record("provenance/r/job.json")
    assert [(e["role"], e["path"], e["sha256"]) for e in record["files"]] == [
        ("input", "src/weights.bin", files.sha256_file(weights)),
        ("output", "out.bin", files.sha256_file(written))]


def test_a_verified_export_is_an_input_with_its_manifest(tmp_path, monkeypatch):
    from encoder_study.onnx import manifest

    monkeypatch.chdir(tmp_path)
    export = Path("results/models/m")
    export.mkdir(parents=True)
    Path("results/tagging/run").mkdir(parents=True)
    (export / "model.onnx").write_bytes(b"graph")
    manifest.write(export, {"model": "m"}, ["model.onnx"])
    with provenance.Fragment("provenance/writeback/job.md", argv=["encoder-study"]) as frag:
        manifest.verified_model(Path("results/tagging/run/../../models/m"))
        frag.outputs.append(export / "model.onnx")  # an output is never also an input
    record = read_record("provenance/writeback/job.json")
    assert [(e["role"], e["path"]) for e in record["files"]] == [
        ("input", "results/models/m/export.json"), ("output", "results/models/m/model.onnx")]


def test_export_model_records_the_weights_it_read(tiny_exports, models_dir, tmp_path):
    source = models_dir / "sources" / "bert-tiny"
    prov = tmp_path / "provenance" / "export" / "export_model-bert-tiny.md"
    assert export_command("model", "--source", str(source / "source.json"), "--out-dir",
                          str(tmp_path / "m"), "--opset", "17", "--tolerance", "1e-4", "--threads", "1",
                          "--ort-optimization", "all", "--provenance", str(prov)) == 0
    inputs = {e["path"]: e["sha256"] for e in read_record(provenance.twin(prov))["files"]
              if e["role"] == "input"}
    listed = json.loads((source / "source.json").read_text())["files"]
    assert {e["path"] for e in listed} >= {"model.safetensors", "config.json", "tokenizer.json"}
    assert inputs == {(source / "source.json").as_posix(): files.sha256_file(source / "source.json"),
                      **{(source / "model" / e["path"]).as_posix(): e["sha256"] for e in listed}}
