"""The XPOS task (data.tasks): the treebank's own tags learned, scored, compared and predicted as UPOS
is, in the column named for it; the UPOS tables leave its runs out."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import boot, boot_argv, runner, train_argv
from encoder_study.core.tables import read_csv
from encoder_study.data import conllu, synthetic, tasks
from encoder_study.encoders.trainable.harness import TrainingError
from encoder_study.recipes.tagging import evaluate, pipeline
from encoder_study.recipes.tagging.splits import RunError

run = runner("tagging")
SIZES = {"train": 120, "dev": 30, "test": 30}


@pytest.fixture(scope="module")
def bank(tmp_path_factory) -> dict:
    return synthetic.write_synthetic(tmp_path_factory.mktemp("treebank"), seed=0, sizes=SIZES)


def columns_that_differ(gold_path, pred_path) -> set[int]:
    """The columns in which the word rows of two CoNLL-U files differ (every other line equal)."""
    found = set()
    for g, p in zip(gold_path.read_text().split("\n"), pred_path.read_text().split("\n"), strict=True):
        g_cols, p_cols = g.split("\t"), p.split("\t")
        if len(g_cols) == 10 and g_cols[0].isdigit():
            found |= {i for i, (a, b) in enumerate(zip(g_cols, p_cols, strict=True)) if a != b}
        else:
            assert g == p
    return found


def test_the_synthetic_treebank_gives_penn_tags_and_the_reader_keeps_them(bank):
    sentences = conllu.read_conllu(bank["train"])
    xpos = Counter(tag for s in sentences for tag in s.tags("xpos"))
    assert "_" not in xpos and {"NN", "NNS", "VBZ", "VBD", "DT", "PRP", "IN", "."} <= set(xpos)
    # the tags follow the words' classes: a plural noun is NNS, a determiner DT
    pairs = Counter((w.upos, w.xpos) for s in sentences for w in s.words)
    assert pairs[("DET", "NN")] == 0 and pairs[("NOUN", "VBZ")] == 0 and pairs[("DET", "DT")] > 0
    # rendering a task's predictions replaces that column only
    first = sentences[0]
    text = first.render(["XX"] * len(first.words), task="xpos")
    rows = [line.split("\t") for line in text.splitlines() if line and line[0].isdigit()]
    assert {r[4] for r in rows} == {"XX"} and [r[3] for r in rows] == list(first.upos)
    with pytest.raises(conllu.TreebankError, match="white space"):
        first.render(["A B"] * len(first.words), task="xpos")


def test_a_tagger_of_an_open_tag_set_takes_its_tags_from_train():
    assert tasks.tag_set("xpos", ["VBZ", "NN", "NN", "DT"]) == ("DT", "NN", "VBZ")
    assert tasks.tag_set("upos", ["NOUN"]) == conllu.UPOS
    with pytest.raises(ValueError, match="in that order"):
        tasks.check_tags("upos", ("NOUN", "VERB"))
    with pytest.raises(ValueError, match="distinct"):
        tasks.check_tags("xpos", ("NN", "NN"))
    rows = [evaluate.score_row("r", "e", "frozen", "mean", "dev",
                               evaluate.accuracy_interval([["NN", "DT"], ["NN"]], [["NN", "DT"], ["VB"]],
                                                          boot()), "xpos")]
    assert evaluate.scores_csv(rows, "xpos").splitlines()[0].split(",")[5] == "xpos"
    assert "| XPOS |" in evaluate.scores_markdown(rows, "xpos")
    assert evaluate.tag_order({"NN": 3, "DT": 3, "VBZ": 5}, "xpos") == ["VBZ", "DT", "NN"]


def test_an_xpos_run_trains_scores_predicts_and_compares_in_its_own_column(tiny_exports, bank, tmp_path):
    out, prov = tmp_path / "tagging", tmp_path / "provenance"
    for name, model in (("tiny-xpos", "bert-tiny"), ("xlmr-xpos", "xlmr-tiny")):
        assert run(*train_argv(name, tiny_exports[model], out, prov, bank, mode="frozen", task="xpos",
                               epochs=2, lr=1e-2)) == 0
    run_dir = out / "tiny-xpos"
    rows = read_csv(run_dir / "scores.csv")
    assert "xpos" in rows[0] and "upos" not in rows[0]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["task"] == "xpos" and record["selected"]["dev_upos"] == float(rows[0]["xpos"])
    train_tags = {t for s in conllu.read_conllu(bank["train"]) for t in s.tags("xpos")}
    assert record["tags"] == sorted(train_tags)
    # the predictions file differs from the gold one in the XPOS column only
    assert columns_that_differ(bank["test"], run_dir / "test.pred.conllu") <= {4}
    tagger = pipeline.load(run_dir / "pipeline.safetensors")
    assert tagger.task == "xpos" and list(tagger.tags) == sorted(train_tags)
    # predict writes the pipeline's task and scores it against the input's own XPOS
    predicted = tmp_path / "predicted.conllu"
    assert run("predict", "--pipeline", str(run_dir / "pipeline.safetensors"), "--input", str(bank["test"]),
               "--out", str(predicted)) == 0
    assert predicted.read_bytes() == (run_dir / "test.pred.conllu").read_bytes()
    # the task's tables: scores and a paired comparison in XPOS; a UPOS table refuses an XPOS run
    dirs = [f"--run-dir={out / n}" for n in ("tiny-xpos", "xlmr-xpos")]
    gold = [f"--gold={s}={bank[s]}" for s in ("dev", "test")]
    tables = ["tables", *dirs, *gold, "--compare", "tiny-xpos:xlmr-xpos", "--scores-out",
              str(out / "xpos" / "scores.csv"), "--comparisons-out", str(out / "xpos" / "comparisons.csv"),
              *boot_argv(), "--caption", "", "--provenance", str(prov / "tagging_task_tables-xpos.md")]
    assert run(*tables[:1], "--task", "xpos", *tables[1:]) == 0
    compared = read_csv(out / "xpos" / "comparisons.csv")
    assert {r["split"] for r in compared} == {"dev", "test"} and "xpos_a" in compared[0]
    assert "XPOS a" in (out / "xpos" / "comparisons.md").read_text()
    with pytest.raises(RunError, match="run 'tiny-xpos' is a run of task xpos; a upos table joins"):
        run(*tables[:1], "--task", "upos", *tables[1:])


def test_an_xpos_run_needs_a_treebank_with_xpos(tiny_exports, bank, tmp_path):
    blank = tmp_path / "blank"
    blank.mkdir()
    for path in bank.values():
        lines = [line.split("\t") for line in path.read_text().split("\n")]
        (blank / path.name).write_text("\n".join("\t".join(c[:4] + ["_"] + c[5:]) if len(c) == 10 else c[0]
                                                 for c in lines))
    blanked = {split: blank / path.name for split, path in bank.items()}
    out = tmp_path / "tagging"
    with pytest.raises(TrainingError, match="split train: words without XPOS"):
        run(*train_argv("x", tiny_exports["bert-tiny"], out, tmp_path / "prov", blanked, mode="frozen",
                        task="xpos", epochs=1))
