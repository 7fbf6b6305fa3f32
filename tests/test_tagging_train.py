"""The UPOS tagger: frozen and fine-tuned training, resuming, saved pipelines and the `tagging` command.

Offline and small: the project's tiny random encoders and MiniLM, a synthetic treebank of a few
dozen sentences, a few steps per run.
"""

from __future__ import annotations

import csv
import json
import re
import shutil

import numpy as np
import pytest
import torch

from conftest import boot, boot_argv, runner, train_argv
from encoder_study.core import files
from encoder_study.data import conllu, synthetic
from encoder_study.encoders.frozen import FrozenEncoder
from encoder_study.encoders.trainable.words import TrainableEncoder
from encoder_study.recipes.tagging import command, evaluate, pipeline, runs
from encoder_study.recipes.tagging import splits as runs_splits
from encoder_study.recipes.tagging.steptime import COLUMNS, IMPLEMENTATIONS, StepTimeError, step_time
from encoder_study.recipes.tagging.tagger import Tagger, word_batches
from encoder_study.recipes.tagging.train import CheckpointError, TrainingError, TrainSettings, train

SIZES = {"train": 60, "dev": 20, "test": 20}
# The settings a test does not choose (the library has no defaults; the config schema holds the workflow's).
UNCHOSEN = {"optimizer": "adamw", "seed": 0, "lr": 1e-3, "weight_decay": 0.01, "epochs": 0, "max_steps": 0,
            "warmup": 0, "batch_words": 100, "eval_every": 0, "eval_batch_words": 2000, "clip": 1.0,
            "patience": 0, "threads": 1, "device": "cpu", "precision": "fp32"}
# The frozen probe as the workflow trains it: full-batch L-BFGS (a step is an iteration and an epoch).
LBFGS = {"optimizer": "lbfgs", "lr": 1.0, "clip": 0.0, "weight_decay": 1e-5}
OPTIONS = runs.EncoderOptions(max_length=512, window_batch=8, max_batch_pieces=8192, freeze_embeddings=True)


def settings_for(mode: str, **chosen) -> TrainSettings:
    return TrainSettings(mode=mode, **{**UNCHOSEN, **chosen})


run = runner("tagging")


@pytest.fixture(scope="module")
def bank(tmp_path_factory) -> dict:
    """split -> path of a small synthetic treebank."""
    return synthetic.write_synthetic(tmp_path_factory.mktemp("treebank"), seed=0, sizes=SIZES)


@pytest.fixture(scope="module")
def sentences(bank) -> dict:
    return {split: conllu.read_conllu(path) for split, path in bank.items()}


def frozen_tagger(model_dir, seed=0) -> Tagger:
    return Tagger(FrozenEncoder(model_dir, pooling="mean", max_length=512), seed=seed)


def trainable_tagger(model_dir, seed=0, freeze_embeddings=True) -> Tagger:
    encoder = TrainableEncoder(model_dir, pooling="first", freeze_embeddings=freeze_embeddings)
    return Tagger(encoder, seed=seed)


def docs(sentences) -> list:
    return [s.doc() for s in sentences]


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- batching and caching ------------------------------------------------------------------------------


def test_word_batches_close_at_batch_words_and_keep_the_order():
    lengths = [3, 5, 2, 7, 1, 4]
    order = [5, 0, 3, 1, 2, 4]
    batches = word_batches(lengths, order, batch_words=8)
    assert [i for b in batches for i in b] == order
    assert batches == [[5, 0, 3], [1, 2, 4]]  # 4+3 < 8 until 7 joins; 5+2+1 = 8 closes the last
    assert all(sum(lengths[i] for i in b[:-1]) < 8 for b in batches)
    with pytest.raises(ValueError, match="batch_words"):
        word_batches(lengths, order, 0)


def test_frozen_encoder_runs_each_document_once_across_epochs(tiny_exports, sentences):
    tagger = frozen_tagger(tiny_exports["bert-tiny"])
    encoder = tagger.encoder
    unique = set(docs(sentences["train"]) + docs(sentences["dev"]))
    windows = sum(len(encoder.tokenizer.prepare(d, encoder.max_length).windows) for d in unique)
    settings = settings_for("frozen", epochs=4, batch_words=100, lr=1e-2)
    result = train(tagger, sentences["train"], sentences["dev"], settings)
    assert result.epochs == 4 and len(result.history) == 4  # dev scored at every epoch's end
    assert result.steps > 4 * 3
    assert encoder.windows_run == windows  # four epochs and four dev evaluations ran the graph once per doc
    tagger.predict(docs(sentences["dev"]))
    assert encoder.windows_run == windows


# -- learning ------------------------------------------------------------------------------------------


def test_frozen_head_learns_and_beats_the_most_frequent_tag_baseline(minilm_export, sentences):
    tagger = frozen_tagger(minilm_export)
    settings = settings_for("frozen", epochs=6, batch_words=100, lr=1e-2)
    result = train(tagger, sentences["train"], sentences["dev"], settings)
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.5 * losses[0]
    baseline = evaluate.most_frequent_tag_baseline(([w.form for w in s.words], s.upos)
                                                   for s in sentences["train"])
    gold = [s.upos for s in sentences["dev"]]
    base = evaluate.accuracy_interval(gold, baseline([[w.form for w in s.words] for s in sentences["dev"]]),
                                      boot()).upos
    ours = evaluate.accuracy_interval(gold, tagger.predict(docs(sentences["dev"])), boot()).upos
    assert ours == result.best_dev_upos  # the weights put back are the ones that scored best
    assert ours > base + 3, (ours, base)


@pytest.mark.parametrize("freeze", [True, False])
def test_finetuning_moves_the_layers_and_only_an_unfrozen_token_table(tiny_exports, sentences, freeze):
    tagger = trainable_tagger(tiny_exports["bert-tiny"], freeze_embeddings=freeze)
    inner = tagger.encoder.encoder
    before = {name: p.detach().clone() for name, p in inner.named_parameters()}
    head_before = tagger.head.weight.detach().clone()
    settings = settings_for("finetuned", max_steps=3, warmup=1, eval_every=3, lr=1e-3,
                                      batch_words=100)
    train(tagger, sentences["train"], sentences["dev"], settings)
    after = dict(inner.named_parameters())
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert not torch.equal(head_before, tagger.head.weight)
    assert "tokens.weight" in before
    assert ("tokens.weight" in moved) is (not freeze)
    assert len(moved - {"tokens.weight"}) == len(before) - 1  # every layer weight moved
    names = {n for n, _ in tagger.named_parameters() if _.requires_grad}
    assert ("encoder.encoder.tokens.weight" in names) is (not freeze)


# -- resuming ------------------------------------------------------------------------------------------


class Crash(Exception):
    """What the test raises to end a run as a crash would, right after a checkpoint is written."""


def crash_after_saves(monkeypatch, count: int) -> list[int]:
    """Make the `count`-th checkpoint write crash the run once the file is written; returns the steps
    saved."""
    write_torch, saved = files.write_torch, []

    def write_then_crash(path, state):
        write_torch(path, state)
        saved.append(state["step"])
        if len(saved) == count:
            raise Crash(f"crashed after saving step {state['step']}")

    monkeypatch.setattr(files, "write_torch", write_then_crash)
    return saved


@pytest.mark.parametrize("mode,model", [("frozen", "bert-tiny"), ("finetuned", "modernbert-tiny")])
def test_a_run_that_saves_crashes_and_resumes_ends_bit_for_bit_where_one_run_ends(
        tiny_exports, sentences, tmp_path, monkeypatch, mode, model):
    make = frozen_tagger if mode == "frozen" else trainable_tagger
    if mode == "frozen":  # dev at the end of each epoch; saves fall inside epochs
        settings = settings_for(mode, epochs=3, batch_words=100, lr=1e-2)
        every = 5
    else:
        settings = settings_for(mode, max_steps=7, eval_every=3, warmup=2, lr=1e-3, batch_words=100)
        every = 2

    whole = make(tiny_exports[model])
    one = train(whole, sentences["train"], sentences["dev"], settings)
    assert one.steps > 2 * every

    # Saving every `every` steps and going on changes nothing (one invocation).
    saving = make(tiny_exports[model])
    kept = train(saving, sentences["train"], sentences["dev"], settings, checkpoint=tmp_path / "kept.pt",
                 chunk_steps=every)
    assert [(c["first_step"], c["last_step"]) for c in kept.chunks] == [(1, one.steps)]
    assert states_equal(whole.trainable_state(), saving.trainable_state())
    assert kept.history == one.history and kept.best_step == one.best_step

    # A crash after the second save; the same call again resumes there, in a fresh tagger as a new
    # process would build, and ends where the uninterrupted run ends.
    checkpoint = tmp_path / "checkpoint.pt"
    with monkeypatch.context() as patch:
        saved = crash_after_saves(patch, 2)
        with pytest.raises(Crash):
            train(make(tiny_exports[model]), sentences["train"], sentences["dev"], settings,
                  checkpoint=checkpoint, chunk_steps=every)
    assert saved == [every, 2 * every]
    resumed = make(tiny_exports[model])
    result = train(resumed, sentences["train"], sentences["dev"], settings, checkpoint=checkpoint,
                   chunk_steps=every)
    assert result.resumed_from == 2 * every
    assert [(c["first_step"], c["last_step"]) for c in result.chunks] == [(1, 2 * every),
                                                                         (2 * every + 1, one.steps)]
    assert states_equal(whole.trainable_state(), resumed.trainable_state())
    assert result.history == one.history and result.best_step == one.best_step
    assert whole.predict(docs(sentences["test"])) == resumed.predict(docs(sentences["test"]))

    # The finished checkpoint resumes as a finished run; other settings are refused.
    again = make(tiny_exports[model])
    finished = train(again, sentences["train"], sentences["dev"], settings, checkpoint=checkpoint)
    assert finished.steps == one.steps and finished.resumed_from == one.steps
    assert states_equal(again.trainable_state(), whole.trainable_state())
    other = TrainSettings(**{**vars(settings), "lr": settings.lr * 2})
    with pytest.raises(CheckpointError, match=r"other settings \(lr: "):
        train(make(tiny_exports[model]), sentences["train"], sentences["dev"], other, checkpoint=checkpoint)


# -- saved pipelines -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["transformer", "transformer-trainable"])
def test_a_saved_pipeline_reloads_to_the_same_predictions(tiny_exports, sentences, tmp_path, kind):
    model_dir = tiny_exports["modernbert-tiny"]
    if kind == "transformer":
        tagger = frozen_tagger(model_dir)
        settings = settings_for("frozen", epochs=2, batch_words=100, lr=1e-2)
    else:
        tagger = trainable_tagger(model_dir)
        settings = settings_for("finetuned", max_steps=3, eval_every=3, warmup=40, lr=1e-3, batch_words=100)
    train(tagger, sentences["train"], sentences["dev"], settings)
    assert tagger.kind == kind
    test_docs = docs(sentences["test"])
    with torch.no_grad():
        logits = tagger.eval()(test_docs)

    # inline; graph pipelines: test_writeback_pipeline.py
    path = pipeline.save(tagger, tmp_path / "out" / pipeline.FILE_NAME, training={"steps": 3})
    saved, tensors = pipeline.read(path)
    assert saved["kind"] == kind and saved["encoder"]["files"] == tagger.encoder_files()
    if kind == "transformer":
        assert sorted(tensors) == ["head.bias", "head.weight"]
    else:
        assert len(tensors) > 2 and not any(name.endswith("tokens.weight") for name in tensors)

    again = pipeline.load(path)  # the model directory recorded relative to the pipeline
    assert again.kind == kind
    with torch.no_grad():
        assert torch.equal(again(test_docs), logits)
    assert again.predict(test_docs) == tagger.predict(test_docs)
    assert states_equal(again.trainable_state(), tagger.trainable_state())
    # Same content, same bytes.
    copy = pipeline.save(again, tmp_path / "out" / "again.safetensors", training={"steps": 3})
    assert copy.read_bytes() == path.read_bytes()


def test_loading_refuses_changed_encoder_files_naming_the_file_and_both_hashes(tiny_exports, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_exports["bert-tiny"], model_dir)
    path = pipeline.save(frozen_tagger(model_dir), tmp_path / pipeline.FILE_NAME)
    expected = files.sha256_file(model_dir / "tokenizer.json")
    with open(model_dir / "tokenizer.json", "a", encoding="utf-8") as handle:
        handle.write("\n")
    actual = files.sha256_file(model_dir / "tokenizer.json")
    with pytest.raises(files.IntegrityError) as err:
        pipeline.load(path)
    message = str(err.value)
    assert "tokenizer.json" in message and expected in message and actual in message

    with pytest.raises(files.IntegrityError, match=r"model\.onnx .*expected SHA-256"):
        pipeline.load(path, model_dir=tiny_exports["xlmr-tiny"])  # another model given at load time
    (tmp_path / "not-a-pipeline.safetensors").write_bytes(b"nonsense")
    with pytest.raises(pipeline.PipelineError, match="the pipeline file is damaged or not a safetensors"):
        pipeline.load(tmp_path / "not-a-pipeline.safetensors")
    damaged = tmp_path / "damaged" / pipeline.FILE_NAME  # a real one whose header was overwritten
    damaged.parent.mkdir()
    damaged.write_bytes(b"\xff" * 16 + path.read_bytes()[16:])
    with pytest.raises(pipeline.PipelineError, match="damaged .*rebuild it: snakemake --cores all -f "):
        pipeline.load(damaged)
    with pytest.raises(pipeline.PipelineError, match="no such pipeline file"):
        pipeline.load(tmp_path / "nowhere" / pipeline.FILE_NAME)


# -- the command ---------------------------------------------------------------------------------------


def read_csv(path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def only_upos_differs(gold_path, pred_path) -> int:
    """Assert the files differ in the UPOS column of word rows only; return how many tags differ."""
    gold = gold_path.read_text(encoding="utf-8").split("\n")
    pred = pred_path.read_text(encoding="utf-8").split("\n")
    assert len(gold) == len(pred)
    changed = 0
    for g, p in zip(gold, pred, strict=True):
        g_cols, p_cols = g.split("\t"), p.split("\t")
        if len(g_cols) == 10 and g_cols[0].isdigit():
            assert p_cols[:3] + p_cols[4:] == g_cols[:3] + g_cols[4:]
            assert p_cols[3] in conllu.UPOS
            changed += p_cols[3] != g_cols[3]
        else:
            assert p == g
    return changed


def test_the_tagging_command_trains_scores_compares_and_writes_provenance(tiny_exports, bank, tmp_path,
                                                                          monkeypatch):
    splits = ["--train", str(bank["train"]), "--dev", str(bank["dev"]), "--test", str(bank["test"])]
    out, prov = tmp_path / "tagging", tmp_path / "provenance" / "tagging"
    assert run(*train_argv("frozen-mean", tiny_exports["bert-tiny"], out, prov, bank, mode="frozen",
                           epochs=2, lr=1e-2)) == 0
    finetune = train_argv("finetuned-first", tiny_exports["bert-tiny"], out, prov, bank, mode="finetuned",
                          pooling="first", **{"max-steps": 4, "eval-every": 2, "warmup": 1, "chunk-steps": 3})
    checkpoint = out / "checkpoints" / "finetuned-first.pt"
    with monkeypatch.context() as patch:  # the job crashes after saving step 3 of 4
        crash_after_saves(patch, 1)
        with pytest.raises(Crash):
            run(*finetune)
    assert checkpoint.is_file()
    assert not (prov / "tagging_train-finetuned-first.md").exists()
    assert run(*finetune) == 0  # the retry resumes from step 3
    assert not checkpoint.exists()
    assert run("baseline", "--run", "baseline", "--task", "upos", "--out-dir", str(out / "baseline"), *splits,
               *boot_argv(),
               "--provenance", str(prov / "tagging_baseline.md")) == 0

    for run_name, mode in (("frozen-mean", "frozen"), ("finetuned-first", "finetuned")):
        run_dir = out / run_name
        for name in ("pipeline.safetensors", "dev.pred.conllu", "test.pred.conllu", "scores.csv", "scores.md",
                     "history.csv", "run.json"):
            assert (run_dir / name).is_file(), name
        rows = read_csv(run_dir / "scores.csv")
        assert [(r["run"], r["encoder"], r["mode"], r["split"]) for r in rows] == [
            (run_name, "bert-tiny", mode, "dev"), (run_name, "bert-tiny", mode, "test")]
        record = json.loads((run_dir / "run.json").read_text())
        assert record["dev_upos_check"] and record["selected"]["dev_upos"] == float(rows[0]["upos"])
        history = read_csv(run_dir / "history.csv")
        assert list(history[0]) == ["step", "epoch", "train_loss", "dev_upos"]
        assert pipeline.load(run_dir / "pipeline.safetensors").kind == (
            "transformer" if mode == "frozen" else "transformer-trainable")
        for split in ("dev", "test"):
            only_upos_differs(bank[split], run_dir / f"{split}.pred.conllu")
        fragment = (prov / f"tagging_train-{run_name}.md").read_text()
        for name in ("pipeline.safetensors", "test.pred.conllu", "model.onnx", "train.conllu"):
            assert name in fragment
        assert files.sha256_file(run_dir / "pipeline.safetensors") in fragment
    assert [int(h["step"]) for h in read_csv(out / "finetuned-first" / "history.csv")] == [2, 4]
    assert "in 2 invocation(s): steps 1-3" in (prov / "tagging_train-finetuned-first.md").read_text()
    # The baseline tags only from train's forms: on this treebank it gets most words right.
    assert only_upos_differs(bank["test"], out / "baseline" / "test.pred.conllu") > 0

    gathered = tmp_path / "gathered"
    run_dirs = [f"--run-dir={out / r}" for r in ("frozen-mean", "finetuned-first", "baseline")]
    assert run("tables", "--task", "upos", *run_dirs,
               "--gold", f"dev={bank['dev']}", "--gold", f"test={bank['test']}",
               "--compare", "finetuned-first:frozen-mean", "--compare", "frozen-mean:baseline",
               "--reference", "baseline", "--scores-out", str(gathered / "scores.csv"),
               "--comparisons-out", str(gathered / "comparisons.csv"),
               "--plot", str(gathered / "dev.png"), "--caption", "Treebank: a test's.",
               *boot_argv(), "--provenance", str(prov / "tagging_tables.md")) == 0
    scores = read_csv(gathered / "scores.csv")
    assert len(scores) == 6 and {r["run"] for r in scores} == {"frozen-mean", "finetuned-first", "baseline"}
    comparisons = read_csv(gathered / "comparisons.csv")
    assert {(r["a"], r["b"], r["split"]) for r in comparisons} == {
        (a, b, s) for a, b in (("finetuned-first", "frozen-mean"), ("frozen-mean", "baseline"))
        for s in ("dev", "test")}
    upos = {(r["run"], r["split"]): float(r["upos"]) for r in scores}
    for r in comparisons:
        assert float(r["diff"]) == pytest.approx(upos[(r["a"], r["split"])] - upos[(r["b"], r["split"])])
        assert float(r["ci_low"]) <= float(r["diff"]) <= float(r["ci_high"])
    assert (gathered / "dev.png").read_bytes()[:4] == b"\x89PNG"
    for table in ("scores.md", "comparisons.md"):  # the caption says what treebank the numbers are on
        assert (gathered / table).read_text().endswith("|\n\nTreebank: a test's.\n"), table
    assert "Comparisons" in (prov / "tagging_tables.md").read_text()
    # A comparison naming an unknown run is refused with the known ones (a user error: exit status 2).
    with pytest.raises(runs_splits.RunError, match=r"no run 'nope' among \['baseline'\]"):
        run("tables", "--task", "upos", f"--run-dir={out / 'baseline'}", "--compare", "baseline:nope",
            "--scores-out", str(tmp_path / "x.csv"), "--comparisons-out", str(tmp_path / "y.csv"),
            *boot_argv(), "--caption", "", "--provenance",
            str(prov / "tagging_tables-bad.md"))


def test_a_checkpointed_run_gives_the_bytes_of_an_uninterrupted_one(tiny_exports, bank, tmp_path,
                                                                     monkeypatch):
    """The default config's fine-tuned run saves midway: every output equals that of a run that never
    saves, and that of a run that crashed after the save and was retried."""
    out, prov = tmp_path / "tagging", tmp_path / "provenance"
    chosen = {"mode": "finetuned", "max-steps": 6, "eval-every": 2, "warmup": 2}
    names = ("pipeline.safetensors", "dev.pred.conllu", "test.pred.conllu", "scores.csv", "scores.md",
             "history.csv", "run.json")

    def outputs(run_name: str, **more) -> dict[str, bytes]:
        argv = train_argv(run_name, tiny_exports["bert-tiny"], out, prov, bank, **{**chosen, **more})
        argv[argv.index("--out-dir") + 1] = str(out / run_name)
        assert run(*argv) == 0
        pipeline.read(out / run_name / pipeline.FILE_NAME)  # its content matches its SHA-256
        # The pipeline's header holds the run's name, and so does the content its SHA-256 covers.
        return {name: re.sub(rb'content_sha256\\": \\"[0-9a-f]{64}', b"SHA",
                             (out / run_name / name).read_bytes().replace(run_name.encode(), b"RUN"))
                for name in names}

    whole = outputs("run-a")  # names of one length: the pipeline's header holds the name
    assert outputs("run-b", **{"chunk-steps": 3}) == whole
    with monkeypatch.context() as patch:
        crash_after_saves(patch, 1)
        with pytest.raises(Crash):
            outputs("run-c", **{"chunk-steps": 3})
    assert (out / "checkpoints" / "run-c.pt").is_file()
    assert outputs("run-c", **{"chunk-steps": 3}) == whole


# -- step time -----------------------------------------------------------------------------------------


def test_step_time_rows_for_both_implementations(tiny_exports, models_dir, tmp_path):
    source = models_dir / "sources" / "bert-tiny" / "source.json"
    rows = step_time(tiny_exports["bert-tiny"], source, batch=4, length=8, warmup=1, steps=2, lr=5e-5, seed=0,
                     min_seconds=0.05)
    assert [r["implementation"] for r in rows] == list(IMPLEMENTATIONS)
    for row in rows:
        assert set(COLUMNS) <= set(row) and row["model"] == "bert-tiny"
        assert all(row[k] > 0 for k in ("forward_s", "backward_s", "clip_s", "optimizer_s", "total_s"))
        # `seconds` sums the timed parts; perf.measure's own clock (>= min_seconds) also holds zero_grad
        assert row["parameters"] > 0 and row["steps"] >= 2 and row["seconds"] > 0
        spread = [row[k] for k in ("total_s_min", "total_s_q1", "total_s", "total_s_q3", "total_s_max")]
        assert spread == sorted(spread)
        assert row["fraction_of_gemm"] == pytest.approx(row["gflops"] / row["gemm_gflops"])
        assert row["fraction_of_gemm"] > 0
        # bert-tiny (2 layers, width 16, feed-forward 32), 4 x 8 pieces: per piece and layer 2*16*64
        # (projections) + 4*8*16 (attention) + 4*16*32 (feed-forward) = 4,608; a step is 3 forwards.
        assert row["gflop"] == pytest.approx(3 * 2 * 32 * 4608 / 1e9)
    assert rows[0]["max_abs"] < 1e-4  # the same weights on the same batch
    out = tmp_path / "step_time.csv"
    # --device auto: the CPU on a machine without a GPU
    timing = ["--batch", "2", "--length", "8", "--warmup", "2", "--steps", "1", "--lr", "5e-5", "--seed", "0",
              "--threads", "1", "--device", "auto", "--min-seconds", "0"]
    assert run("step-time", "--model", str(tiny_exports["bert-tiny"]), str(source), "--out", str(out),
               *timing, "--provenance", str(tmp_path / "prov" / "tagging_step_time.md")) == 0
    table = read_csv(out)
    assert list(table[0]) == COLUMNS and [r["implementation"] for r in table] == list(IMPLEMENTATIONS)
    assert {r["device"] for r in table} == {"cuda" if torch.cuda.is_available() else "cpu"}
    assert np.isfinite([float(r["total_s"]) for r in table]).all()
    if not torch.cuda.is_available():  # the GEMM probe the rows were read against, in the fragment
        assert (tmp_path / "prov" / "tagging_step_time.md").read_text().count("GEMM probe at 1 thread") == 1
    with pytest.raises(StepTimeError, match="describes another source"):
        run("step-time", "--model", str(tiny_exports["bert-tiny"]),
            str(models_dir / "sources" / "xlmr-tiny" / "source.json"), "--out", str(out), *timing,
            "--provenance", str(tmp_path / "prov" / "tagging_step_time-bad.md"))


def test_every_option_is_required_the_schema_holds_the_defaults(capsys):
    with pytest.raises(SystemExit):
        command.parser().parse_args(["step-time", "--model", "m", "s", "--out", "o", "--provenance", "p"])
    assert "the following arguments are required: --batch, --length" in capsys.readouterr().err


def test_settings_need_an_end_and_a_matching_encoder(tiny_exports, sentences):
    with pytest.raises(TrainingError, match="set epochs or max_steps"):
        settings_for("frozen", epochs=0)
    with pytest.raises(TrainingError, match="mode"):
        train(frozen_tagger(tiny_exports["bert-tiny"]), sentences["train"], sentences["dev"],
              settings_for("finetuned", max_steps=1))
    built = runs.build_tagger(tiny_exports["bert-tiny"], "finetuned", "mean", 0, OPTIONS, threads=1)
    assert built.kind == "transformer-trainable"


def test_extra_test_sets_are_scored_compared_and_leave_dev_and_test_bytes_alone(tiny_exports, bank, tmp_path):
    ood = synthetic.write_ood(tmp_path / "ood.conllu", 0, 15)
    out, prov = tmp_path / "tagging", tmp_path / "provenance"
    plain = train_argv("plain", tiny_exports["bert-tiny"], out, prov, bank, mode="frozen", epochs=2, lr=1e-2)
    assert run(*plain) == 0
    extra = train_argv("extra", tiny_exports["bert-tiny"], out, prov, bank, mode="frozen", epochs=2, lr=1e-2)
    assert run(*extra, "--extra", f"ood={ood}") == 0
    for split in ("dev", "test"):  # the extra set changes nothing the run wrote before
        assert (out / "extra" / f"{split}.pred.conllu").read_bytes() == (
            out / "plain" / f"{split}.pred.conllu").read_bytes()
    only_upos_differs(ood, out / "extra" / "ood.pred.conllu")
    rows = {r["split"]: r for r in read_csv(out / "extra" / "scores.csv")}  # sorted rows: dev, ood, test
    assert sorted(rows) == ["dev", "ood", "test"]
    assert [{k: v for k, v in rows[s].items() if k != "run"} for s in ("dev", "test")] == [
        {k: v for k, v in r.items() if k != "run"} for r in read_csv(out / "plain" / "scores.csv")]
    assert float(rows["ood"]["ci_low"]) <= float(rows["ood"]["upos"]) <= float(rows["ood"]["ci_high"])
    assert "ood" in json.loads((out / "extra" / "run.json").read_text())["splits"]
    splits = ["--train", str(bank["train"]), "--dev", str(bank["dev"]), "--test", str(bank["test"])]
    assert run("baseline", "--run", "baseline", "--task", "upos", "--out-dir", str(out / "baseline"), *splits,
               "--extra", f"ood={ood}", *boot_argv(),
               "--provenance", str(prov / "tagging_baseline.md")) == 0
    assert [r["split"] for r in read_csv(out / "baseline" / "scores.csv")] == ["dev", "ood", "test"]
    with pytest.raises(SystemExit):  # a treebank split's name is not an extra set's
        command.parser().parse_args([*extra, "--extra", f"test={ood}"])

    gathered = tmp_path / "gathered"
    assert run("tables", "--task", "upos", f"--run-dir={out / 'extra'}", f"--run-dir={out / 'baseline'}",
               "--gold", f"dev={bank['dev']}", "--gold", f"test={bank['test']}", "--gold", f"ood={ood}",
               "--compare", "extra:baseline", "--scores-out", str(gathered / "scores.csv"),
               "--comparisons-out", str(gathered / "comparisons.csv"), "--caption", "",
               *boot_argv(), "--provenance", str(prov / "tagging_tables.md")) == 0
    scores = {(r["run"], r["split"]): float(r["upos"]) for r in read_csv(gathered / "scores.csv")}
    comparisons = {r["split"]: r for r in read_csv(gathered / "comparisons.csv")}
    assert sorted(comparisons) == ["dev", "ood", "test"]
    assert float(comparisons["ood"]["diff"]) == pytest.approx(scores[("extra", "ood")]
                                                              - scores[("baseline", "ood")])
