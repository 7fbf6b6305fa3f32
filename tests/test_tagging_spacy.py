"""spaCy runs (encoder_study.recipes.tagging.spacy): the treebank's words as spaCy documents (multiword tokens
as their words), tags from token.pos_, a tiny deterministic training from the committed config, a
published pipeline's wheel (fetched, checked, unpacked), and the run in the scores and comparisons."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import spacy
from spacy.language import Language
from spacy.util import load_config

from conftest import ROOT, boot, boot_argv, cli_runner, runner, snakemake_each
from encoder_study import cli
from encoder_study.core import download, files, tables
from encoder_study.data import conllu
from encoder_study.data.synthetic import write_synthetic
from encoder_study.provenance import deps
from encoder_study.recipes.tagging import baseline, gather, spacy_fetch
from encoder_study.recipes.tagging import spacy as spacy_tagger

MWT = """\
# sent_id = s1
# text = I can't go del mar.
1\tI\tI\tPRON\t_\t_\t0\troot\t_\t_
2-3\tcan't\t_\t_\t_\t_\t_\t_\t_\t_
2\tca\tcan\tAUX\t_\t_\t0\troot\t_\t_
3\tn't\tnot\tPART\t_\t_\t0\troot\t_\t_
4\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_
5-6\tdel\t_\t_\t_\t_\t_\t_\t_\t_
5\tde\tde\tADP\t_\t_\t0\troot\t_\t_
6\tel\tel\tDET\t_\t_\t0\troot\t_\t_
7\tmar\tmar\tNOUN\t_\t_\t0\troot\t_\tSpaceAfter=No
8\t.\t.\tPUNCT\t_\t_\t0\troot\t_\t_

"""
WORDS = ["I", "ca", "n't", "go", "de", "el", "mar", "."]
# By hand from the text: a space after I, n't, go, el; none inside can't or del, nor before the period.
SPACES = [True, False, True, True, False, True, False, False]
# The test component's tags: a word -> its POS; SPACE and "" are spaCy POS outside UD's tags.
LOOKUP = {"I": "PRON", "ca": "AUX", "n't": "PART", "go": "VERB", "de": "SPACE", "el": "DET", ".": "PUNCT"}


@Language.component("test_lookup_pos")
def lookup_pos(doc):
    for token in doc:
        token.pos_ = LOOKUP.get(token.text, "")
    return doc


@Language.component("test_merge_first_two")
def merge_first_two(doc):
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[0:2])
    return doc


def mwt_sentence():
    return conllu.parse_conllu(MWT)[0]


def test_the_words_of_a_multiword_token_are_tagged_not_its_surface_form():
    sentence = mwt_sentence()
    assert spacy_tagger.words_and_spaces(sentence) == (WORDS, SPACES)
    doc = spacy_tagger.make_doc(spacy.blank("en").vocab, sentence, gold=True)
    assert [t.text for t in doc] == WORDS and [t.pos_ for t in doc] == list(sentence.upos)
    assert doc.text == "I can't go deel mar."  # `del` is not spelled by its words: they keep theirs


def test_a_sentence_without_such_tokens_keeps_its_text(tmp_path):
    paths = write_synthetic(tmp_path, 0, {"train": 30, "dev": 5, "test": 5})
    sentences = conllu.read_conllu(paths["train"])
    vocab = spacy.blank("en").vocab
    spelled = [s for s in sentences if all(len(w.form) == w.end - w.start for w in s.words)]
    assert len(spelled) > 20
    for sentence in spelled:
        assert spacy_tagger.make_doc(vocab, sentence).text == sentence.text


def test_tags_come_from_pos_one_per_word_and_non_ud_pos_is_x(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("test_lookup_pos")
    tagged = spacy_tagger.tag(nlp, [mwt_sentence()], batch_size=4)
    assert tagged.upos == [("PRON", "AUX", "PART", "VERB", "X", "DET", "X", "PUNCT")]
    assert dict(tagged.not_ud) == {"SPACE": 1, "(none)": 1}
    out = tmp_path / "s.pred.conllu"
    conllu.write_predictions([mwt_sentence()], tagged.upos, out)
    rows = [line.split("\t") for line in out.read_text().splitlines() if line and not line.startswith("#")]
    assert [r[3] for r in rows] == ["PRON", "_", "AUX", "PART", "VERB", "_", "X", "DET", "X", "PUNCT"]


def test_a_component_that_changes_the_tokens_is_refused():
    nlp = spacy.blank("en")
    nlp.add_pipe("test_merge_first_two")
    with pytest.raises(spacy_tagger.SpacyError, match="returned 7 tokens for 8 words"):
        spacy_tagger.tag(nlp, [mwt_sentence()], batch_size=4)


# --- training ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bank(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("bank")
    paths = write_synthetic(out, 0, {"train": 80, "dev": 20, "test": 20})
    extra = write_synthetic(out / "extra", 5, {"train": 1, "dev": 1, "test": 15})["test"]
    return {**paths, "ood": extra}


def tiny_config(tmp_path: Path) -> Path:
    """The committed config, with a training of a few steps (the rest as committed)."""
    config = load_config(ROOT / "config/spacy/tagger.cfg", interpolate=False,
                         overrides={"training.max_steps": 30, "training.eval_frequency": 10})
    path = tmp_path / "tiny.cfg"
    config.to_disk(path)
    return path


def spacy_argv(out: Path, bank: dict, *source: str) -> list[str]:
    return ["spacy", "--run", out.name, *source, "--dev", str(bank["dev"]), "--test", str(bank["test"]),
            "--extra", f"ood={bank['ood']}", "--out-dir", str(out), "--batch-size", "16",
            *boot_argv(200),
            "--provenance", str(out.parent / "prov" / f"tagging_spacy-{out.name}.md")]


def train_argv(out: Path, bank: dict, config: Path) -> list[str]:
    return spacy_argv(out, bank, "--source", "train", "--config", str(config), "--seed", "0",
                      "--train", str(bank["train"]))


@pytest.fixture(scope="module")
def trained(bank, tmp_path_factory) -> tuple[Path, Path]:
    """(run directory, config) of a tiny spaCy training through the command."""
    base = tmp_path_factory.mktemp("trained")
    config = tiny_config(base)
    assert runner("tagging")(*train_argv(base / "spacy", bank, config)) == 0
    return base / "spacy", config


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files.list_files(root)}


def test_training_is_deterministic_and_the_saved_pipeline_is_the_selected_one(trained, bank, tmp_path):
    run_dir, config = trained
    assert runner("tagging")(*train_argv(tmp_path / "spacy", bank, config)) == 0
    first, second = tree(run_dir), tree(tmp_path / "spacy")
    assert first.keys() == second.keys() and "spacy/tok2vec/model" in first
    assert [k for k in first if first[k] != second[k]] == []
    record = json.loads((run_dir / "run.json").read_text())
    assert record["mode"] == "spacy" and record["components"] == ["tok2vec", "morphologizer"]
    assert [h["step"] for h in record["history"]] == [0, 10, 20, 30]
    assert record["dev_upos_check"] is True and record["spacy_version"] == spacy.__version__
    saved = load_config(run_dir / "spacy/config.cfg", interpolate=False)
    assert saved["paths"]["train"] is None and saved["paths"]["dev"] is None and saved["system"]["seed"] == 0
    assert saved["training"]["logger"]["output_file"] is None
    assert saved["corpora"]["train"]["gold_preproc"] is True  # trained on the gold words


def test_a_run_is_scored_against_the_gold_file_and_compared_like_any_run(trained, bank, tmp_path):
    run_dir, _ = trained
    rows = {r["split"]: r for r in tables.read_csv(run_dir / "scores.csv")}
    assert sorted(rows) == ["dev", "ood", "test"]
    for split in rows:  # UPOS counted here from the files, apart from the command
        gold = conllu.read_conllu(bank[split])
        pred = conllu.read_conllu(run_dir / f"{split}.pred.conllu")
        pairs = [(g.upos, p.upos) for s, t in zip(gold, pred, strict=True)
                 for g, p in zip(s.words, t.words, strict=True)]
        assert float(rows[split]["upos"]) == 100 * sum(a == b for a, b in pairs) / len(pairs)
        assert rows[split]["mode"] == "spacy" and rows[split]["pooling"] == "none"
    baseline.baseline_run("baseline", {k: bank[k] for k in ("train", "dev", "test", "ood")},
                      tmp_path / "baseline", boot(200))
    gathered = gather.gather([run_dir, tmp_path / "baseline"], {s: bank[s] for s in ("dev", "test", "ood")},
                           [("spacy", "baseline")], tmp_path / "scores.csv", tmp_path / "comparisons.csv",
                           None, [], boot(200))
    assert {(r["run"], r["split"]) for r in gathered.scores} >= {("spacy", "dev"), ("spacy", "test")}
    test = next(r for r in gathered.comparisons if r["split"] == "test")
    baseline_test = next(r for r in gathered.scores if r["run"] == "baseline" and r["split"] == "test")
    assert test["diff"] == pytest.approx(float(rows["test"]["upos"]) - float(baseline_test["upos"]), abs=1e-9)


# --- a published pipeline -----------------------------------------------------------------------------

def make_wheel(pipeline: Path, path: Path, name: str = "test_tagger", version: str = "0.1.0",
               extra: dict[str, bytes] | None = None) -> Path:
    """A wheel laid out as explosion/spacy-models' (<lang>_<name>/<lang>_<name>-<version>/...)."""
    package = f"en_{name}"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{package}/__init__.py", "")
        archive.writestr(f"{package}-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
        for relative, data in tree(pipeline).items():
            if relative == "meta.json":
                meta = json.loads(data)
                data = json.dumps({**meta, "name": name, "version": version}).encode()
            archive.writestr(f"{package}/{package}-{version}/{relative}", data)
        for member, data in (extra or {}).items():
            archive.writestr(member, data)
    return path


def test_a_package_run_tags_with_the_wheels_pipeline(trained, bank, tmp_path):
    run_dir, _ = trained
    wheel = make_wheel(run_dir / "spacy", tmp_path / "source.whl")
    digest = files.sha256_file(wheel)
    fetched = tmp_path / "fetched.whl"
    fetch = ["spacy-fetch", "--url", wheel.as_uri(), "--sha256", digest, "--timeout", "5",
             "--out", str(fetched), "--provenance", str(tmp_path / "prov" / "fetch.md")]
    assert runner("tagging")(*fetch) == 0 and fetched.read_bytes() == wheel.read_bytes()
    package = spacy_argv(tmp_path / "pkg", bank, "--source", "package", "--wheel", str(fetched),
                         "--package", "en_test_tagger", "--version", "0.1.0")
    assert runner("tagging")(*package) == 0
    for split in ("dev", "test", "ood"):  # the same pipeline as the trained run's: the same tags
        assert (tmp_path / "pkg" / f"{split}.pred.conllu").read_bytes() == \
            (run_dir / f"{split}.pred.conllu").read_bytes()
    record = json.loads((tmp_path / "pkg" / "run.json").read_text())
    assert record["encoder"] == "en_test_tagger-0.1.0" and record["source"]["wheel_sha256"] == digest
    assert "history" not in record and "train" not in record["splits"]


def test_a_wheel_is_checked_before_it_is_kept(trained, tmp_path, capsys):
    run_dir, _ = trained
    wheel = make_wheel(run_dir / "spacy", tmp_path / "source.whl")
    out = tmp_path / "out.whl"
    with pytest.raises(files.IntegrityError, match="does not match"):
        spacy_fetch.fetch_package(str(wheel), "0" * 64, out, timeout=5)
    assert not out.exists()
    (tmp_path / "not.whl").write_text("not a zip")
    with pytest.raises(download.DownloadError, match="not a wheel"):
        spacy_fetch.fetch_package(str(tmp_path / "not.whl"), "", out, timeout=5)
    assert spacy_fetch.fetch_package(str(wheel), "", out, timeout=5) == (files.sha256_file(wheel), False)
    assert f"its SHA-256 is {files.sha256_file(wheel)}" in capsys.readouterr().err  # the pin to give
    with pytest.raises(spacy_tagger.SpacyError, match="no pipeline en_test_tagger/en_test_tagger-0.2.0/"):
        spacy_tagger.unpack_package(out, "en_test_tagger", "0.2.0", tmp_path / "p")
    renamed = make_wheel(run_dir / "spacy", tmp_path / "renamed.whl", name="other", version="0.1.0")
    with zipfile.ZipFile(renamed, "a") as archive:  # the right directory, another pipeline's meta.json
        archive.writestr("en_test_tagger/en_test_tagger-0.1.0/meta.json", json.dumps({"lang": "en",
                         "name": "other", "version": "0.1.0"}))
    with pytest.raises(spacy_tagger.SpacyError, match="its pipeline is en_other 0.1.0"):
        spacy_tagger.unpack_package(renamed, "en_test_tagger", "0.1.0", tmp_path / "p")
    hostile = make_wheel(run_dir / "spacy", tmp_path / "hostile.whl",
                         extra={"en_test_tagger/en_test_tagger-0.1.0/../../evil": b"x"})
    with pytest.raises(spacy_tagger.SpacyError, match="refused member"):
        spacy_tagger.unpack_package(hostile, "en_test_tagger", "0.1.0", tmp_path / "p")
    assert not (tmp_path / "p").exists() and not (tmp_path / "evil").exists()


def test_a_source_without_its_options_is_refused(bank, tmp_path, capsys):
    argv = spacy_argv(tmp_path / "x", bank, "--source", "package", "--wheel", "w.whl")
    assert cli_runner("tagging")(*argv) == 2
    assert "--source package needs --package, --version" in capsys.readouterr().err


# --- the workflow --------------------------------------------------------------------------------------

def test_the_configs_plan_the_spacy_runs():
    """The default trains its spaCy run; paper.yaml downloads en_core_web_sm; the rehearsal trains under
    that name, offline; each is compared with its fine-tuned run."""
    paper = ("--configfile", "config/paper.yaml")
    # --forceall: the whole plan, also in a checkout whose run has finished
    argvs = {"default": ["-n", "-p", "--forceall", "--cores", "2", "tagging"],
             "paper": ["-n", "-p", "--forceall", "--cores", "8", "tagging", *paper],
             "rehearsal": ["-n", "-p", "--forceall", "--cores", "2", "tagging", *paper,
                           "config/rehearsal.yaml"]}
    plans = dict(zip(argvs, snakemake_each(*argvs.values()), strict=True))  # in one Python process
    for name, plan in plans.items():
        assert plan.returncode == 0, (name, plan.stderr[-3000:])
    assert "tagging spacy --run spacy --source train --config config/spacy/tagger.cfg --seed 0" \
        in plans["default"].stdout
    assert "--compare minilm-finetuned:spacy" in plans["default"].stdout
    paper = plans["paper"].stdout
    assert ("tagging spacy-fetch --url https://github.com/explosion/spacy-models/releases/download/"
            "en_core_web_sm-3.8.0/en_core_web_sm-3.8.0-py3-none-any.whl") in paper
    assert "tagging spacy --run spacy-sm --source package" in paper and "--package en_core_web_sm" in paper
    assert "--compare mmbert-finetuned:spacy-sm" in paper
    assert "--run spacy-sm --source train" in plans["rehearsal"].stdout
    assert "tagging spacy-fetch" not in plans["rehearsal"].stdout


# The encoders and the training of a tagger: the spaCy runs use none of it.
ENCODER_CODE = ("recipes/tagging/runs.py", "recipes/tagging/train.py", "recipes/tagging/tagger.py",
                "recipes/tagging/pipeline.py", "encoders/frozen.py", "onnx/runtime.py", "encoders/tokens.py")


@pytest.mark.parametrize("command, own", [("spacy", "recipes/tagging/spacy.py"),
                                          ("baseline", "recipes/tagging/baseline.py"),
                                          ("tables", "recipes/tagging/gather.py"),
                                          ("per_tag", "recipes/tagging/gather.py")])
def test_the_runs_without_an_encoder_and_the_tables_hold_no_encoder_code(command, own):
    """The rule's code inputs are what the command reaches (deps.code_files): the run's own modules and
    the scoring it shares with every run, so that editing an encoder or its training reruns neither the
    runs that use no encoder (spaCy, the baseline) nor the tables (they read what the runs wrote)."""
    lib = ROOT / "workflow/lib/encoder_study"
    found = {Path(p).relative_to(lib).as_posix()
             for p in deps.code_files(ROOT / "workflow/lib", cli.COMMANDS["tagging"], command)}
    assert {own, "recipes/tagging/splits.py", "recipes/tagging/evaluate.py", "data/conllu.py"} <= found
    assert not found & set(ENCODER_CODE), found & set(ENCODER_CODE)
    assert not [p for p in found if p.startswith(("encoders/", "onnx/", "recipes/student/"))], found
