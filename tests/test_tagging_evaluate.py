"""UPOS evaluation: sentence bootstrap intervals, paired differences, the baseline, tables and the plot."""

import csv
import io
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from conftest import boot
from encoder_study.recipes.tagging import evaluate as ev
from encoder_study.recipes.tagging import figures

Z = stats.norm.ppf(0.975)


def tagged(correct, lengths):
    """Gold and predicted tags for sentences with the given lengths and numbers of correct tokens."""
    gold = [["NOUN"] * int(n) for n in lengths]
    pred = [["NOUN"] * int(c) + ["VERB"] * int(n - c) for c, n in zip(correct, lengths, strict=True)]
    return gold, pred


def varied(n=300, seed=3):
    """Sentences of varied length and difficulty, like a real test set."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 30, n)
    correct = rng.binomial(lengths, rng.beta(20, 1, n))
    return tagged(correct, lengths)


def test_counts_are_per_sentence_and_token_weighted():
    # A wrong 1-token sentence and a right 9-token one: 90% of tokens, though half the sentences.
    gold, pred = tagged([0, 9], [1, 9])
    correct, tokens = ev.sentence_counts(gold, pred)
    assert correct.tolist() == [0, 9] and tokens.tolist() == [1, 9]
    result = ev.accuracy_interval(gold * 50, pred * 50, boot(resamples=500))
    assert result.upos == 90.0 and result.tokens == 500 and result.sentences == 100
    assert result.ci_low < 90.0 < result.ci_high and result.ci_low > 50.0


def test_interval_matches_the_normal_approximation_for_equal_lengths():
    # 2,000 sentences of 10 tokens: accuracy is the mean of the per-sentence counts / 10, so the
    # bootstrap standard error is the plug-in sd of the counts / sqrt(n), and the percentile interval
    # should be upos +- 1.96 SE. Tolerance 0.15 SE per end: with 4,000 resamples the Monte Carlo sd of
    # a 2.5% quantile is sqrt(0.025 * 0.975 / 4000) / phi(1.96) = 0.042 SE, and the skewness of the
    # mean (Cornish-Fisher, (z^2 - 1) / 6 * skew / sqrt(n)) shifts the ends by about 0.01 SE.
    rng = np.random.default_rng(7)
    counts = rng.binomial(10, 0.9, 2000)
    gold, pred = tagged(counts, [10] * 2000)
    result = ev.accuracy_interval(gold, pred, boot(resamples=4000, seed=1))
    se = 100 * counts.std() / 10 / math.sqrt(2000)
    assert result.upos == pytest.approx(100 * counts.mean() / 10, abs=1e-12)
    assert abs(result.ci_low - (result.upos - Z * se)) < 0.15 * se
    assert abs(result.ci_high - (result.upos + Z * se)) < 0.15 * se


def test_sentences_not_tokens_are_resampled():
    # 200 sentences of 20 tokens, alternately all right and all wrong: the sentence bootstrap has
    # SE = 100 * 0.5 / sqrt(200) = 3.54 points (width 13.9); resampling the 4,000 tokens would give
    # SE = 100 * 0.5 / sqrt(4000) = 0.79 (width 3.1), sqrt(20) times narrower.
    gold, pred = tagged([20, 0] * 100, [20] * 200)
    by_sentence = ev.accuracy_interval(gold, pred, boot(resamples=2000))
    width = by_sentence.ci_high - by_sentence.ci_low
    assert width == pytest.approx(2 * Z * 100 * 0.5 / math.sqrt(200), rel=0.1)
    # The same tokens as one-token "sentences": what a token bootstrap would report.
    flat_gold = [[t] for s in gold for t in s]
    flat_pred = [[t] for s in pred for t in s]
    by_token = ev.accuracy_interval(flat_gold, flat_pred, boot(resamples=2000))
    assert by_token.upos == by_sentence.upos == 50.0
    assert by_token.ci_high - by_token.ci_low < 0.3 * width


@pytest.mark.parametrize("method", ev.METHODS)
def test_always_right_gives_exactly_100_and_always_wrong_0(method):
    gold, pred = varied()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # BCa on a constant distribution would warn and give NaN
        right = ev.accuracy_interval(gold, gold, boot(resamples=300, method=method))
        wrong = ev.accuracy_interval(gold, [["X"] * len(s) for s in gold], boot(resamples=300, method=method))
    assert (right.upos, right.ci_low, right.ci_high) == (100.0, 100.0, 100.0)
    assert (wrong.upos, wrong.ci_low, wrong.ci_high) == (0.0, 0.0, 0.0)
    assert right.method == method


def test_degenerate_and_malformed_inputs_are_refused():
    gold, pred = tagged([2], [3])
    with pytest.raises(ValueError, match="at least two sentences"):
        ev.accuracy_interval(gold, pred, boot())
    with pytest.raises(ValueError, match="sentence 1: 2 gold tags but 1 predicted"):
        ev.accuracy_interval([["A"], ["A", "B"]], [["A"], ["A"]], boot())
    with pytest.raises(ValueError, match="2 gold sentences but 1 predicted"):
        ev.accuracy_interval([["A"], ["B"]], [["A"]], boot())
    with pytest.raises(ValueError, match="no tokens"):
        ev.accuracy_interval([["A"], []], [["A"], []], boot())
    with pytest.raises(ValueError, match="interval method"):
        ev.accuracy_interval([["A"], ["B"]], [["A"], ["B"]], boot(method="studentized"))


def test_bca_is_close_to_percentile_on_a_realistic_set():
    gold, pred = varied(n=600)
    pct = ev.accuracy_interval(gold, pred, boot(resamples=2000, method="percentile"))
    bca = ev.accuracy_interval(gold, pred, boot(resamples=2000, method="BCa"))
    assert bca.method == "bca" and (bca.ci_low, bca.ci_high) != (pct.ci_low, pct.ci_high)
    width = pct.ci_high - pct.ci_low
    assert abs(bca.ci_low - pct.ci_low) < 0.1 * width and abs(bca.ci_high - pct.ci_high) < 0.1 * width


def test_same_seed_same_interval_other_seed_other_interval():
    gold, pred = varied()
    first = ev.accuracy_interval(gold, pred, boot(resamples=500, seed=11))
    assert ev.accuracy_interval(gold, pred, boot(resamples=500, seed=11)) == first
    other = ev.accuracy_interval(gold, pred, boot(resamples=500, seed=12))
    assert other.upos == first.upos
    assert (other.ci_low, other.ci_high) != (first.ci_low, first.ci_high)


@pytest.mark.parametrize("method", ev.METHODS)
def test_a_system_against_itself_differs_by_exactly_zero(method):
    gold, pred = varied()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = ev.paired_difference(gold, pred, pred, boot(resamples=300, method=method))
    assert (same.diff, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)
    assert repr(same.ci_low) == "0.0"  # not -0.0, which the tables would print as such
    assert same.upos_a == same.upos_b


def test_paired_difference_uses_the_resamples_of_each_system_alone():
    # Against a system that is always wrong, a - b is a's accuracy on every resample, so with the same
    # seed the paired interval must be a's interval bit for bit.
    gold, pred = varied()
    never = [["X"] * len(s) for s in gold]
    alone = ev.accuracy_interval(gold, pred, boot(resamples=500, seed=5))
    diff = ev.paired_difference(gold, pred, never, boot(resamples=500, seed=5))
    assert (diff.diff, diff.ci_low, diff.ci_high) == (alone.upos, alone.ci_low, alone.ci_high)


def test_paired_interval_is_narrower_than_unpaired_on_correlated_systems():
    # b makes all of a's errors (which cluster in hard sentences) and 1% more: the sentence-to-sentence
    # variation is shared, so pairing removes most of it.
    rng = np.random.default_rng(21)
    gold, pred_a = varied(n=800, seed=4)
    pred_b = [[t if rng.random() > 0.01 else "ADJ" for t in s] for s in pred_a]
    a = ev.accuracy_interval(gold, pred_a, boot(resamples=2000, seed=2))
    b = ev.accuracy_interval(gold, pred_b, boot(resamples=2000, seed=2))
    diff = ev.paired_difference(gold, pred_a, pred_b, boot(resamples=2000, seed=2))
    assert diff.diff == pytest.approx(a.upos - b.upos, abs=1e-9)
    assert (diff.upos_a, diff.upos_b) == (a.upos, b.upos)
    assert 0 < diff.ci_low < diff.diff < diff.ci_high
    unpaired = math.hypot(a.ci_high - a.ci_low, b.ci_high - b.ci_low)  # independent intervals
    assert diff.ci_high - diff.ci_low < 0.5 * unpaired


TRAIN = [
    (["The", "dog", "runs"], ["DET", "NOUN", "VERB"]),
    (["the", "runs", "."], ["DET", "NOUN", "PUNCT"]),
    (["Fish", "swim", "."], ["NOUN", "VERB", "PUNCT"]),
]


def test_baseline_tags_each_form_with_its_most_frequent_tag():
    tagger = ev.most_frequent_tag_baseline(TRAIN)
    # "runs" is VERB once and NOUN once: the tie goes to the name that sorts first.
    assert tagger.tag(["The", "dog", "runs", "."]) == ["DET", "NOUN", "NOUN", "PUNCT"]
    # Unknown forms get the most frequent tag of train (NOUN, 3 of 9), however they are spelled.
    assert tagger([["THE", "zebra"], ["Dog", "the"]]) == [["NOUN", "NOUN"], ["NOUN", "DET"]]
    backoff = ev.most_frequent_tag_baseline(TRAIN, lowercase_backoff=True)
    assert backoff.tag(["THE", "Swim", "zebra"]) == ["DET", "VERB", "NOUN"]
    # The order of the train set does not matter.
    assert ev.most_frequent_tag_baseline(TRAIN[::-1]).by_form == tagger.by_form


def test_baseline_breaks_an_overall_tie_by_name_and_refuses_bad_train():
    tagger = ev.most_frequent_tag_baseline([(["b", "a"], ["Y", "X"])])
    assert tagger.default == "X" and tagger.tag(["c", "b"]) == ["X", "Y"]
    with pytest.raises(ValueError, match="train sentence 0: 2 forms but 1 tags"):
        ev.most_frequent_tag_baseline([(["a", "b"], ["X"])])
    with pytest.raises(ValueError, match="no tokens"):
        ev.most_frequent_tag_baseline([])


def score_rows():
    gold, pred = varied(n=50)
    acc = ev.accuracy_interval(gold, pred, boot(resamples=200))
    base = ev.accuracy_interval(gold, [["NOUN"] * (len(s) - 1) + ["X"] for s in gold], boot(200))
    rows = [ev.score_row("tiny-frozen", "bert-tiny", "frozen", "mean", "test", acc),
            ev.score_row("baseline", "none", "baseline", "none", "test", base),
            ev.score_row("tiny-frozen", "bert-tiny", "frozen", "mean", "dev", acc)]
    rows[0]["upos"] = np.float64(rows[0]["upos"])  # numpy floats must not print as np.float64(...)
    return rows


def test_scores_table_has_the_contract_columns_and_stable_bytes(tmp_path):
    rows = score_rows()
    text = ev.scores_csv(rows)
    assert text == ev.scores_csv(rows[::-1])
    header, *lines = list(csv.reader(io.StringIO(text)))
    assert header[:10] == ["run", "encoder", "mode", "pooling", "split", "upos", "ci_low", "ci_high",
                           "tokens", "sentences"]
    assert {"resamples", "seed"} <= set(header)
    assert [(r[0], r[4]) for r in lines] == [("baseline", "test"), ("tiny-frozen", "dev"),
                                            ("tiny-frozen", "test")]
    assert "np." not in text and text.endswith("\n")
    read = list(csv.DictReader(io.StringIO(text)))
    assert float(read[2]["upos"]) == rows[0]["upos"] and float(read[2]["ci_low"]) == rows[0]["ci_low"]

    csv_path, md_path = ev.write_scores(tmp_path / "scores.csv", rows)
    first = (csv_path.read_bytes(), md_path.read_bytes())
    ev.write_scores(tmp_path / "scores.csv", rows[::-1])
    assert (csv_path.read_bytes(), md_path.read_bytes()) == first
    assert md_path.name == "scores.md" and csv_path.read_text() == text
    markdown = md_path.read_text()
    assert markdown == ev.scores_markdown(read)  # rows read back from the CSV render the same
    assert markdown.splitlines()[0].startswith("| run | encoder | mode | pooling | split | UPOS | 95% CI |")
    assert len(markdown.splitlines()) == 2 + 3
    r = rows[0]
    assert f"| {r['upos']:.2f} | [{r['ci_low']:.2f}, {r['ci_high']:.2f}] |" in markdown


def test_tables_refuse_duplicate_keys_and_missing_columns():
    rows = score_rows()
    with pytest.raises(ValueError, match="share the key"):
        ev.scores_csv([rows[0], dict(rows[0])])
    broken = dict(rows[0])
    del broken["tokens"]
    with pytest.raises(ValueError, match=r"missing columns \['tokens'\]"):
        ev.scores_csv([broken])


def test_comparisons_table_has_the_contract_columns_and_stable_bytes(tmp_path):
    gold, pred_a = varied(n=60)
    pred_b = [s[:-1] + ["X"] for s in pred_a]
    rows = [ev.comparison_row("fine-tuned", "frozen", "test",
                              ev.paired_difference(gold, pred_a, pred_b, boot(resamples=200))),
            ev.comparison_row("frozen", "frozen", "test",
                              ev.paired_difference(gold, pred_a, pred_a, boot(resamples=200)))]
    text = ev.comparisons_csv(rows)
    assert text == ev.comparisons_csv(rows[::-1])
    header = text.splitlines()[0].split(",")
    assert header[:5] == ["a", "b", "diff", "ci_low", "ci_high"] and {"split", "resamples"} <= set(header)
    assert text.splitlines()[2].startswith("frozen,frozen,0.0,0.0,0.0,test,")
    csv_path, md_path = ev.write_comparisons(tmp_path / "comparisons.csv", rows)
    first = (csv_path.read_bytes(), md_path.read_bytes())
    ev.write_comparisons(tmp_path / "comparisons.csv", rows[::-1])
    assert (csv_path.read_bytes(), md_path.read_bytes()) == first
    d = rows[0]
    assert f"| {d['diff']:+.2f} | [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}] |" in md_path.read_text()


def test_dev_curve_plot_is_byte_stable(tmp_path):
    curves = {"fine-tuned": [(200, 96.9), (100, 96.1), (50, 94.0)], "frozen": [(100, 95.0), (200, 96.4)]}
    figures.plot_dev_curves(curves, tmp_path / "a.png", references={"frozen encoder": 96.39})
    figures.plot_dev_curves(dict(reversed(curves.items())), tmp_path / "b.png",
                       references={"frozen encoder": 96.39})
    data = (tmp_path / "a.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data == (tmp_path / "b.png").read_bytes()
    assert b"Software" not in data
    with pytest.raises(ValueError, match="no development scores"):
        figures.plot_dev_curves({"empty": []}, tmp_path / "c.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]  # no temporary files left
