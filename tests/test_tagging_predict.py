"""`encoder-study tagging predict`: a saved pipeline applied to a file gives the run's own predictions,
byte for byte, whatever the reading batch; plain text in, CoNLL-U out; refusals that leave nothing."""

from __future__ import annotations

import pytest

from conftest import runner, train_argv
from encoder_study.core import tables
from encoder_study.data import conllu, synthetic
from encoder_study.encoders.tokens import Doc
from encoder_study.recipes import writeback
from encoder_study.recipes.tagging import pipeline, predict, runs
from encoder_study.recipes.tagging.tagger import word_batches

SIZES = {"train": 60, "dev": 20, "test": 20}
EVAL_BATCH_WORDS = 30  # small: a split is tagged in several groups, which the reading batches must not move


run = runner("tagging")


@pytest.fixture(scope="module")
def bank(tmp_path_factory) -> dict:
    return synthetic.write_synthetic(tmp_path_factory.mktemp("treebank"), seed=0, sizes=SIZES)


@pytest.fixture(scope="module")
def trained(tiny_exports, bank, tmp_path_factory) -> dict:
    """name -> (pipeline file, run directory whose .pred.conllu it must reproduce)."""
    out = tmp_path_factory.mktemp("tagging")
    small = {"eval-batch-words": EVAL_BATCH_WORDS}
    assert run(*train_argv("frozen", tiny_exports["bert-tiny"], out, out / "provenance", bank, mode="frozen",
                           epochs=2, lr=1e-2, **small)) == 0
    assert run(*train_argv("finetuned", tiny_exports["bert-tiny"], out, out / "provenance", bank,
                           mode="finetuned", **small,
                           **{"max-steps": 4, "eval-every": 2, "warmup": 1, "lr": 1e-2})) == 0
    inline = out / "finetuned" / pipeline.FILE_NAME
    # The writeback recipe's pipeline: the fine-tuned weights written into a graph beside the file.
    graph = writeback.save_with_graph(pipeline.load(inline), out / "writeback" / pipeline.FILE_NAME,
                                      training=pipeline.training_summary(inline)).path
    assert graph.with_name(pipeline.graph_name(graph)).is_file()
    return {"frozen": (out / "frozen" / pipeline.FILE_NAME, out / "frozen"),
            "finetuned": (inline, out / "finetuned"),
            "graph": (graph, out / "finetuned")}


@pytest.mark.parametrize("name", ["frozen", "finetuned", "graph"])
def test_predict_gives_the_runs_own_predictions_byte_for_byte(trained, bank, tmp_path, name, capsys):
    path, run_dir = trained[name]
    for split in ("dev", "test"):
        gold = conllu.read_conllu(bank[split])
        groups = word_batches([len(s.words) for s in gold], range(len(gold)), EVAL_BATCH_WORDS)
        assert len(groups) > 3  # the run tagged the split in several groups
        expected = runs.pred_path(run_dir, split).read_bytes()
        assert expected != bank[split].read_bytes()  # some tag differs from gold: the comparison can fail
        for batch in (1000, 7, 1):  # reading batches that cut the groups anywhere
            out = tmp_path / f"{split}-{batch}.conllu"
            assert run("predict", "--pipeline", str(path), "--input", str(bank[split]), "--out", str(out),
                       "--batch-sentences", str(batch)) == 0
            assert out.read_bytes() == expected, (name, split, batch)
        progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("predict: ")]
        assert len(progress) > 3 and all("words/s" in line for line in progress)  # a line per batch tagged
        assert sum(line.startswith("predict: 20 sentences") for line in progress) == 3  # each call's last
    # With --score: the run's own test score, from the same tags.
    assert run("predict", "--pipeline", str(path), "--input", str(bank["test"]), "--out",
               str(tmp_path / "scored.conllu"), "--score", "--bootstrap-resamples", "100") == 0
    score = next(r for r in tables.read_csv(run_dir / runs.SCORES) if r["split"] == "test")
    printed = capsys.readouterr().out
    assert f"UPOS {float(score['upos']):.2f} [{float(score['ci_low']):.2f}, {float(score['ci_high']):.2f}]" \
        in printed


def test_plain_text_in_conllu_out(trained, bank, tmp_path):
    path, _ = trained["finetuned"]
    gold = conllu.read_conllu(bank["test"])
    lines = [" ".join(w.form for w in s.words) for s in gold]
    lines.insert(3, "   ")  # a blank line is skipped; sentence ids stay line numbers
    source = tmp_path / "in.txt"
    source.write_text("\n".join(["  " + lines[0] + "\t"] + lines[1:]) + "\n", encoding="utf-8")
    out = tmp_path / "out.conllu"
    assert run("predict", "--pipeline", str(path), "--input", str(source), "--out", str(out),
               "--format", "text", "--batch-sentences", "3") == 0
    tagged = conllu.read_conllu(out)  # the project's reader takes it
    assert [s.sent_id for s in tagged] == [str(i) for i in range(1, 25) if i != 4][:len(gold)]
    assert [[w.form for w in s.words] for s in tagged] == [[w.form for w in s.words] for s in gold]
    assert all(s.text == " ".join(w.form for w in s.words) for s in tagged)
    for row in out.read_text(encoding="utf-8").splitlines():
        if row and not row.startswith("#"):
            columns = row.split("\t")
            assert columns[2:3] + columns[4:] == ["_"] * 7 and columns[3] in conllu.UPOS
    # The tags are the pipeline's for those words joined by spaces, in the run's groups.
    tagger = pipeline.load(path)
    docs = [Doc.from_words([w.form for w in s.words]) for s in gold]
    assert [list(s.upos) for s in tagged] == tagger.predict(docs, EVAL_BATCH_WORDS)
    # Tagging the output again as CoNLL-U gives it back byte for byte.
    again = tmp_path / "again.conllu"
    assert run("predict", "--pipeline", str(path), "--input", str(out), "--out", str(again)) == 0
    assert again.read_bytes() == out.read_bytes()
    with pytest.raises(predict.PredictError, match="gold tags"):
        run("predict", "--pipeline", str(path), "--input", str(source), "--out", str(tmp_path / "x.conllu"),
            "--format", "text", "--score")
    assert not (tmp_path / "x.conllu").exists()


def test_refusals_name_the_file_and_leave_nothing(trained, bank, tmp_path):
    path, _ = trained["graph"]
    out = tmp_path / "out" / "pred.conllu"
    missing = tmp_path / "nope" / pipeline.FILE_NAME
    with pytest.raises(predict.PredictError, match=rf"{missing}: no such pipeline file; give --pipeline"):
        run("predict", "--pipeline", str(missing), "--input", str(bank["test"]), "--out", str(out))
    with pytest.raises(predict.PredictError, match="no such input file"):
        run("predict", "--pipeline", str(path), "--input", str(tmp_path / "in.conllu"), "--out", str(out))
    with pytest.raises(predict.PredictError, match="would replace the input"):
        run("predict", "--pipeline", str(path), "--input", str(bank["test"]), "--out", str(bank["test"]))
    # A written-graph pipeline without its graph: refused, naming both files.
    alone = tmp_path / "alone" / pipeline.FILE_NAME
    alone.parent.mkdir()
    alone.write_bytes(path.read_bytes())
    with pytest.raises(pipeline.PipelineError, match=r"pipeline.encoder0.onnx is missing"):
        run("predict", "--pipeline", str(alone), "--input", str(bank["test"]), "--out", str(out))
    # A bad sentence in a later reading batch: the error has the file's own line number, and the
    # batches already tagged leave no output behind.
    text = bank["test"].read_text(encoding="utf-8").split("\n")
    row = max(i for i, line in enumerate(text) if line.startswith("1\t"))
    columns = text[row].split("\t")
    text[row] = "\t".join(columns[:3] + ["NOPE"] + columns[4:])
    bad = tmp_path / "bad.conllu"
    bad.write_text("\n".join(text), encoding="utf-8")
    with pytest.raises(conllu.TreebankError, match=rf"{bad}:{row + 1}: unknown UPOS 'NOPE'"):
        conllu.read_conllu(bad)
    with pytest.raises(conllu.TreebankError, match=rf"{bad}:{row + 1}: unknown UPOS 'NOPE'"):
        run("predict", "--pipeline", str(path), "--input", str(bad), "--out", str(out),
            "--batch-sentences", "2")
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_reading_in_batches_gives_the_file_back(bank, tmp_path):
    """Batches of any size are the reader's sentences, lines and line numbers, duplicates refused."""
    whole = conllu.read_conllu(bank["dev"])
    for size in (1, 3, 1000):
        batches = list(predict.conllu_batches(bank["dev"], size))
        assert all(len(b) <= size for b in batches)
        assert [s for b in batches for s in b] == whole
    text = bank["dev"].read_text(encoding="utf-8")
    twice = tmp_path / "twice.conllu"
    twice.write_text("\n\n" + text + text, encoding="utf-8")
    with pytest.raises(conllu.TreebankError, match="was already used by the sentence at line 3"):
        list(predict.conllu_batches(twice, 5))
