"""The study's plots (`encoder_study.core.plots`: one style, byte-identical PNGs) and the tables they
draw: the
forest plots of scores and comparisons, per-tag accuracy of the best runs, latency and write-back speed.

Offline and model-free: a hand-written two-sentence treebank and predictions chosen word by word.
"""

from __future__ import annotations

import json

import pytest

from conftest import boot, runner
from encoder_study.core import plots, tables
from encoder_study.data import conllu
from encoder_study.recipes.parity import parity_tables
from encoder_study.recipes.tagging import evaluate, figures, gather, splits
from encoder_study.recipes.writeback import speed

PNG = b"\x89PNG\r\n\x1a\n"

# Ten words; "cannot" is a multiword token (can + not), whose row is not a word and is not scored.
GOLD = """\
# sent_id = s1
# text = The dog runs .
1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tdog\tdog\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\truns\trun\tVERB\t_\t_\t0\troot\t_\t_
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# sent_id = s2
# text = A cat cannot sleep .
1\tA\ta\tDET\t_\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\t_\t_\t5\tnsubj\t_\t_
3-4\tcannot\t_\t_\t_\t_\t_\t_\t_\t_
3\tcan\tcan\tAUX\t_\t_\t5\taux\t_\t_
4\tnot\tnot\tPART\t_\t_\t5\tadvmod\t_\t_
5\tsleep\tsleep\tVERB\t_\t_\t0\troot\t_\t_
6\t.\t.\tPUNCT\t_\t_\t5\tpunct\t_\t_

"""
RIGHT = (["DET", "NOUN", "VERB", "PUNCT"], ["DET", "NOUN", "AUX", "PART", "VERB", "PUNCT"])
# run -> (mode, development UPOS written to its scores, predicted test tags per sentence)
RUNS = {
    # 8 of 10 right: "runs" tagged NOUN, "not" tagged ADV.
    "frozen-a": ("frozen", 90.0, [["DET", "NOUN", "NOUN", "PUNCT"],
                                  ["DET", "NOUN", "AUX", "ADV", "VERB", "PUNCT"]]),
    # The same development score as frozen-a: the tie goes to the name that sorts first (frozen-a).
    "frozen-b": ("frozen", 90.0, list(RIGHT)),
    "frozen-c": ("frozen", 80.0, list(RIGHT)),
    # 9 of 10: "The" tagged PRON.
    "tuned": ("finetuned", 85.0, [["PRON", "NOUN", "VERB", "PUNCT"], RIGHT[1]]),
    # The best development score, but neither frozen nor fine-tuned: never chosen.
    "baseline": ("baseline", 99.0, list(RIGHT)),
}


@pytest.fixture
def study(tmp_path):
    """A gold test file, one run directory per entry of RUNS (run.json, test predictions, scores.csv) and
    the gathered scores.csv, as the workflow lays them out."""
    gold_path = tmp_path / "treebank" / "test.conllu"
    gold_path.parent.mkdir()
    gold_path.write_text(GOLD, encoding="utf-8")
    gold = conllu.read_conllu(gold_path)
    all_rows, run_dirs = [], {}
    for name, (mode, dev, predicted) in RUNS.items():
        run_dir = tmp_path / "tagging" / name
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"run": name, "mode": mode}))
        test = splits.score_split(gold, predicted, splits.pred_path(run_dir, "test"), boot(50))
        dev_accuracy = evaluate.Accuracy(dev, dev - 1, dev + 1, 10, 2, 50, 0, "percentile", 0.95)
        rows = [evaluate.score_row(name, "enc", mode, "mean", "dev", dev_accuracy),
                evaluate.score_row(name, "enc", mode, "mean", "test", test)]
        evaluate.write_scores(run_dir / "scores.csv", rows)
        all_rows += rows
        run_dirs[name] = run_dir
    evaluate.write_scores(tmp_path / "tagging" / "scores.csv", all_rows)
    return {"gold": gold_path, "dirs": run_dirs, "scores": tmp_path / "tagging" / "scores.csv",
            "out": tmp_path / "out"}


# -- per-tag accuracy ---------------------------------------------------------------------------------

def test_per_tag_counts_are_exact_and_skip_multiword_rows(study):
    gold = [s.upos for s in conllu.read_conllu(study["gold"])]
    counts = evaluate.per_tag_counts(gold, RUNS["frozen-a"][2])
    assert counts == {"DET": (2, 2), "NOUN": (2, 2), "VERB": (2, 1), "PUNCT": (2, 2), "AUX": (1, 1),
                      "PART": (1, 0)}
    # Most frequent first, ties in the UD list's order.
    assert evaluate.tag_order({t: n for t, (n, _) in counts.items()}) == [
        "DET", "NOUN", "PUNCT", "VERB", "AUX", "PART"]
    with pytest.raises(evaluate.EvaluationError, match="sentence 1: 6 gold tags but 5 predicted"):
        evaluate.per_tag_counts(gold, [gold[0], gold[1][:5]])
    with pytest.raises(evaluate.EvaluationError, match="not UD UPOS tags"):
        evaluate.tag_order({"NOUN": 3, "NOPE": 1})


def test_best_runs_take_the_highest_dev_score_of_each_mode_ties_by_name():
    rows = [{"run": run, "mode": mode, "split": "dev", "upos": str(dev)}
            for run, (mode, dev, _) in RUNS.items()]
    rows += [{"run": "tuned", "mode": "finetuned", "split": "test", "upos": "100.0"}]  # not dev: ignored
    assert gather.best_runs(rows) == {"frozen": ("frozen-a", 90.0), "finetuned": ("tuned", 85.0)}
    assert gather.best_runs(list(reversed(rows))) == gather.best_runs(rows)  # whatever the order of the rows
    assert gather.best_runs([r for r in rows if r["mode"] != "finetuned"]) == {"frozen": ("frozen-a", 90.0)}


def test_per_tag_table_of_the_best_frozen_and_fine_tuned_runs(study):
    out = study["out"] / "per_tag.csv"
    done = gather.per_tag(list(study["dirs"].values()), study["scores"], study["gold"], "test", out,
                        study["out"] / "per_tag.png", "Treebank: a test's.")
    assert done.best == {"frozen": ("frozen-a", 90.0), "finetuned": ("tuned", 85.0)}
    # Every run.json is read (to name the runs), so each is an input, not only the chosen runs'.
    read = {p.as_posix() for p in done.inputs if p.name == "run.json"}
    assert read == {f"{d}/run.json" for d in study["dirs"].values()} and len(read) == len(RUNS)
    assert out.read_text() == (
        "run,mode,split,upos,gold,correct,accuracy\n"
        "frozen-a,frozen,test,DET,2,2,100.0\n"
        "frozen-a,frozen,test,NOUN,2,2,100.0\n"
        "frozen-a,frozen,test,PUNCT,2,2,100.0\n"
        "frozen-a,frozen,test,VERB,2,1,50.0\n"
        "frozen-a,frozen,test,AUX,1,1,100.0\n"
        "frozen-a,frozen,test,PART,1,0,0.0\n"
        "tuned,finetuned,test,DET,2,1,50.0\n"
        "tuned,finetuned,test,NOUN,2,2,100.0\n"
        "tuned,finetuned,test,PUNCT,2,2,100.0\n"
        "tuned,finetuned,test,VERB,2,2,100.0\n"
        "tuned,finetuned,test,AUX,1,1,100.0\n"
        "tuned,finetuned,test,PART,1,1,100.0\n")
    markdown = out.with_suffix(".md").read_text()
    assert "| frozen-a | frozen | test | VERB | 2 | 1 | 50.00 |" in markdown
    assert "best frozen: frozen-a (development UPOS 90.00); best finetuned: tuned" in markdown
    assert "ties" not in markdown and "a tie going to the run name that sorts first" in markdown
    assert markdown.endswith("\n\nTreebank: a test's.\n")
    first = (study["out"] / "per_tag.png").read_bytes()
    assert first.startswith(PNG)
    gather.per_tag(list(study["dirs"].values()), study["scores"], study["gold"], "test", out,
                 study["out"] / "per_tag.png", "Treebank: a test's.")
    assert (study["out"] / "per_tag.png").read_bytes() == first


def test_per_tag_refuses_counts_that_do_not_add_up_to_the_recorded_score(study):
    # Another prediction file than the one scored: the counts no longer give scores.csv's test UPOS.
    gold = conllu.read_conllu(study["gold"])
    conllu.write_predictions(gold, RUNS["baseline"][2], splits.pred_path(study["dirs"]["tuned"], "test"))
    with pytest.raises(gather.RunError, match=r"counts give UPOS 100.0 on test, but .* records \[90.0\]"):
        gather.per_tag(list(study["dirs"].values()), study["scores"], study["gold"], "test",
                     study["out"] / "t.csv", study["out"] / "t.png", "")
    with pytest.raises(gather.RunError, match="none of the runs"):
        gather.per_tag([study["dirs"]["baseline"]], study["scores"], study["gold"], "test",
                     study["out"] / "t.csv", study["out"] / "t.png", "")


def test_the_per_tag_command_writes_its_fragment(study, tmp_path):
    prov = tmp_path / "provenance" / "tagging_per_tag.md"
    argv = ["per-tag", *(f"--run-dir={d}" for d in study["dirs"].values()), "--scores", str(study["scores"]),
            "--split", "test", "--gold", str(study["gold"]), "--out", str(study["out"] / "per_tag.csv"),
            "--plot", str(study["out"] / "per_tag.png"), "--caption", "", "--provenance", str(prov)]
    assert runner("tagging")(*argv) == 0
    fragment = prov.read_text()
    assert "Per-tag accuracy (test)" in fragment
    assert "test.pred.conllu" in fragment and "per_tag.png" in fragment


# -- forest plots ----------------------------------------------------------------------------------------

def test_split_order_puts_test_first_and_dev_last():
    assert evaluate.split_order(["dev", "test", "pud", "ood", "dev"]) == ["test", "ood", "pud", "dev"]
    assert evaluate.split_order(["dev"]) == ["dev"]


def test_gather_draws_scores_and_comparisons_as_forest_plots_byte_for_byte(study):
    out = study["out"]
    names = ("frozen-a", "tuned", "baseline")

    def gathered_once():
        return gather.gather([study["dirs"][n] for n in names], {"test": study["gold"]},
                             [("tuned", "frozen-a"), ("tuned", "baseline")], out / "scores.csv",
                             out / "comparisons.csv", None, [], boot(50), "", scores_plot=out / "scores.png",
                             comparisons_plot=out / "comparisons.png")

    gathered = gathered_once()
    assert {out / "scores.png", out / "comparisons.png"} <= set(gathered.outputs)
    first = {name: (out / name).read_bytes() for name in ("scores.png", "comparisons.png")}
    assert all(data.startswith(PNG) for data in first.values())
    assert first["scores.png"] != first["comparisons.png"]
    gathered_once()
    assert {name: (out / name).read_bytes() for name in first} == first
    with pytest.raises(gather.RunError, match="without comparisons"):
        gather.gather([study["dirs"]["tuned"]], {}, [], out / "s.csv", None, None, [], boot(50),
                    comparisons_plot=out / "c.png")


def test_each_forest_panel_takes_the_range_of_its_own_rows():
    headline = plots.Interval("minilm-finetuned - minilm-frozen-mean", -1.12, -1.84, -0.41)
    others = [plots.Interval("minilm-frozen-mean - minilm-frozen-first", 0.76, 0.41, 1.17),
              plots.Interval("minilm-finetuned - baseline", 9.53, 8.15, 10.96)]
    random = [plots.Interval("bert-tiny-finetuned - baseline", -58.0, -59.77, -56.16)]
    low, high = plots.panel_limits([headline, *others], zero=True)
    span = 10.96 + 1.84
    assert (low, high) == pytest.approx((-1.84 - 0.06 * span, 10.96 + 0.06 * span))
    # The headline's interval fills a tenth of its panel; on one axis with the random model's row it
    # filled 2 % (the reviewer's complaint: a dot at zero).
    assert (headline.high - headline.low) / (high - low) > 0.09
    shared = plots.panel_limits([headline, *others, *random], zero=True)
    assert (headline.high - headline.low) / (shared[1] - shared[0]) < 0.025
    # Zero joins the range of a panel of differences; a single point gets half a unit each side.
    assert plots.panel_limits(random, zero=True)[1] == pytest.approx(0.06 * 59.77)
    assert plots.panel_limits([plots.Interval("x", 3.0, 3.0, 3.0)]) == (2.5, 3.5)


def test_forest_panels_group_by_split_and_encoder(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "forest", lambda groups, *a, **k: drawn.append(
        [(heading, [i.label for i in items]) for heading, items in groups]))

    def row(a, b, split, diff=1.0):
        return {"a": a, "b": b, "diff": diff, "ci_low": diff - 1, "ci_high": diff + 1, "split": split,
                "upos_a": 0, "upos_b": 0, "tokens": 1, "sentences": 1, "resamples": 10, "seed": 0,
                "method": "percentile", "confidence": 0.95}

    rows = [row(a, b, split) for split in ("dev", "test") for a, b in (
        ("tiny-a", "baseline"), ("big-a", "big-b"), ("big-b", "baseline"))]
    figures.plot_comparisons(rows, tmp_path / "c.png", {"tiny-a": "tiny", "big-a": "big", "big-b": "big"})
    big, tiny = ["big-a - big-b", "big-b - baseline"], ["tiny-a - baseline"]
    assert drawn.pop() == [("test: big", big), ("test: tiny", tiny), ("dev: big", big), ("dev: tiny", tiny)]
    figures.plot_comparisons(rows, tmp_path / "c.png")  # no encoders known: a panel per split
    assert [heading for heading, _ in drawn.pop()] == ["split: test", "split: dev"]


# -- the conventions -----------------------------------------------------------------------------------

def test_plots_ignore_the_users_matplotlib_settings_and_repeat_their_bytes(tmp_path):
    import matplotlib

    groups = [("split: test", [plots.Interval("a", 97.0, 96.5, 97.4),
                               plots.Interval("b", 95.0, 94.1, 95.8)])]
    plots.forest(groups, tmp_path / "one.png", "UPOS (%)", "t")
    with matplotlib.rc_context({"lines.linewidth": 7.0, "font.size": 20, "axes.facecolor": "red"}):
        plots.forest(groups, tmp_path / "two.png", "UPOS (%)", "t")
    assert (tmp_path / "one.png").read_bytes() == (tmp_path / "two.png").read_bytes()
    # Not a constant picture: another value draws other bytes.
    plots.forest([("split: test", [plots.Interval("a", 90.0, 89.0, 91.0)])], tmp_path / "three.png",
                 "UPOS (%)", "t")
    assert (tmp_path / "three.png").read_bytes() != (tmp_path / "one.png").read_bytes()
    assert b"Software" not in (tmp_path / "one.png").read_bytes()


def test_bars_check_their_series_and_pick_a_log_axis_for_orders_of_magnitude(tmp_path):
    with pytest.raises(ValueError, match="series 'x' has 1 values for 2 categories"):
        plots.bars(["a", "b"], {"x": [plots.Bar(1.0)]}, tmp_path / "bad.png", "y", "t")
    assert plots.log_axis({"x": [plots.Bar(0.1, 0.05, 0.2), plots.Bar(50.0)]})
    assert not plots.log_axis({"x": [plots.Bar(10.0, 5.0, 20.0), plots.Bar(50.0)]})
    assert not plots.log_axis({"x": [plots.Bar(0.0), plots.Bar(500.0)]})  # a zero: no log axis


LATENCY = [
    {"model": "m", "runtime": "onnxruntime", "threads": "2", "batch": "1", "seq_len": "64",
     "median_ms": "0.16", "min_ms": "0.14", "max_ms": "0.24", "runs": "20"},
    {"model": "m", "runtime": "pytorch", "threads": "2", "batch": "1", "seq_len": "64",
     "median_ms": "62.6", "min_ms": "54.9", "max_ms": "79.0", "runs": "20"},
]


def test_the_latency_gather_draws_bars_with_their_spread(tmp_path):
    part = tmp_path / "m.csv"
    # Every column the table has (a number where this test does not choose one), these ones as given.
    rows = [{**dict.fromkeys(parity_tables.LATENCY_COLUMNS, "1.0"), **r} for r in LATENCY]
    part.write_text(tables.csv_text(rows, parity_tables.LATENCY_COLUMNS))
    report = parity_tables.gather("latency", [part], tmp_path / "latency.csv", tmp_path / "latency.md",
                                  tmp_path / "latency.png")
    first = (tmp_path / "latency.png").read_bytes()
    assert first.startswith(PNG) and tmp_path / "latency.png" in report.outputs
    parity_tables.plot_latency(tables.read_csv(tmp_path / "latency.csv"), tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes() == first
    with pytest.raises(ValueError, match="the trainable table has no plot"):
        parity_tables.gather("trainable", [], tmp_path / "t.csv", tmp_path / "t.md", tmp_path / "t.png")


SPEED = """\
run,encoder,threads,sentences,tokens,repeats,modules_tok_s,graph_tok_s,ratio,modules_tok_s_min,\
modules_tok_s_max,graph_tok_s_min,graph_tok_s_max
a-tuned,a,1,200,1308,3,2196.2,3201.7,1.46,2000.0,2300.0,3000.0,3300.0
a-tuned,a,2,200,1308,3,3677.9,4387.7,1.19,3500.0,3800.0,4100.0,4500.0
"""


def test_speed_bars_read_the_spread_columns_and_do_without_them(tmp_path):
    table = tmp_path / "speed.csv"
    table.write_text(SPEED)
    prov = tmp_path / "prov" / "writeback_speed_plot.md"
    assert runner("writeback")("speed-plot", "--table", str(table), "--out", str(tmp_path / "speed.png"),
                               "--provenance", str(prov)) == 0
    with_spread = (tmp_path / "speed.png").read_bytes()
    assert with_spread.startswith(PNG) and "speed.csv" in prov.read_text()
    speed.plot_speed(tables.read_csv(table), tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes() == with_spread
    # Without the spread columns (or with empty cells): bars without error bars, no failure.
    bare = [{k: v for k, v in r.items() if not k.endswith(("_min", "_max"))} for r in tables.read_csv(table)]
    speed.plot_speed(bare, tmp_path / "bare.png")
    empty = [{**r, "graph_tok_s_min": ""} for r in tables.read_csv(table)]
    speed.plot_speed(empty, tmp_path / "empty.png")
    assert (tmp_path / "bare.png").read_bytes().startswith(PNG)
    assert (tmp_path / "bare.png").read_bytes() != with_spread
    assert (tmp_path / "empty.png").read_bytes() not in (with_spread, (tmp_path / "bare.png").read_bytes())
    assert speed.speed_bar(bare[0], "graph_tok_s") == plots.Bar(3201.7)
