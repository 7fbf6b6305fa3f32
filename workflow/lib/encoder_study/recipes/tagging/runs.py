"""Trained runs, as the workflow's rules make them: train, select, score and save the tagger.

A run directory (results/tagging/<run>/) holds:

| file | what |
|---|---|
| `pipeline.safetensors` | the saved tagger (trained runs; see `pipeline`) |
| `dev.pred.conllu`, `test.pred.conllu` | the gold files with only the UPOS column predicted |
| `<name>.pred.conllu` | the same for each extra test set (treebank.extra_tests, e.g. `pud`, `ood`) |
| `scores.csv`, `scores.md` | the run's rows of the scores table (dev, test and each extra test set) |
| `history.csv` | step, epoch, train_loss, dev_upos at every development evaluation (trained runs) |
| `run.json` | run, encoder, mode, pooling, the settings, the selected step and why training stopped |

What every kind of run does with its splits (which it scores, the predictions file and its score, the
record of each split read) is `splits`'s, which the spaCy runs share.

The baseline run is `baseline`'s; the tables gathered from run directories are `gather`'s.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from ... import provenance
from ...core import files
from ...core.tables import markdown_table
from ...data.conllu import Sentence
from ...data.tasks import DEFAULT as DEFAULT_TASK
from ...data.tasks import TASKS, tag_set
from ...encoders.frozen import FrozenEncoder
from ...encoders.trainable.harness import TrainingError
from ...encoders.trainable.words import TrainableEncoder
from . import evaluate, pipeline
from .settings import Bootstrap
from .splits import (
    HISTORY,
    RUN_JSON,
    SCORES,
    history_csv,
    pred_path,
    read_splits,
    score_split,
    scored_splits,
    scores_said,
    split_record,
)
from .tagger import Tagger
from .train import TrainResult, TrainSettings, autocast, settled, train


@dataclasses.dataclass(frozen=True)
class EncoderOptions:
    """How the encoder is built (besides the model and the pooling); the config schema holds the defaults."""

    max_length: int                  # pieces per window, specials included
    window_batch: int                # frozen: windows per ONNX Runtime call
    max_batch_pieces: int            # fine-tuned: padded pieces per forward batch
    freeze_embeddings: bool          # fine-tuned: keep the token table out of training


def build_tagger(model_dir: str | os.PathLike, mode: str, pooling: str, seed: int, options: EncoderOptions,
                 threads: int, task: str = DEFAULT_TASK, train: Sequence[Sentence] = ()) -> Tagger:
    """A fresh tagger (seeded head) over the frozen or the trainable encoder of an exported model, for
    `task`'s tags (an open set's from the `train` sentences: data.tasks.tag_set)."""
    if mode == "frozen":
        encoder = FrozenEncoder(model_dir, pooling=pooling, max_length=options.max_length,
                                batch_size=options.window_batch, threads=threads)
    elif mode == "finetuned":
        encoder = TrainableEncoder(model_dir, pooling=pooling, max_length=options.max_length,
                                   max_batch_pieces=options.max_batch_pieces,
                                   freeze_embeddings=options.freeze_embeddings, threads=threads)
    else:
        raise ValueError(f"mode must be 'frozen' or 'finetuned', got {mode!r}")
    tags = tag_set(task, (tag for s in train for tag in s.tags(task)))
    return Tagger(encoder, seed=seed, tags=tags, task=task)


@dataclasses.dataclass
class TrainedRun:
    """What `train_run` wrote and measured."""

    rows: list[dict]
    result: TrainResult
    outputs: list[Path]
    record: dict


def train_run(run: str, model_dir: str | os.PathLike, pooling: str, paths: dict[str, str | os.PathLike],
              out_dir: str | os.PathLike, settings: TrainSettings, options: EncoderOptions,
              checkpoint: str | os.PathLike, chunk_steps: int, bootstrap: Bootstrap,
              progress: bool, task: str = DEFAULT_TASK) -> TrainedRun:
    """Train on paths["train"], select on paths["dev"], score dev and test once with the selected weights.

    Any other name in `paths` is an extra test set (out-of-domain, say): scored once too, like test.
    `task` (data.tasks) is the column learned and scored: UPOS, or the treebank's XPOS.

    The training state is saved to `checkpoint` every `chunk_steps` steps (0: only when training ends)
    and resumed from it when it exists, so a rerun after a crash goes on where the last save left off
    and ends where an uninterrupted run ends. The checkpoint is removed once every output is written.
    """
    out_dir = Path(out_dir)
    checkpoint = Path(checkpoint)
    scored = scored_splits(paths)
    sentences = read_splits({split: paths[split] for split in ("train", *scored)})
    # The thread count, device and precision of training hold for the final predictions too, so that
    # the development predictions written are exactly the ones that selected the weights.
    with settled(settings):
        check_task(task, sentences)
        tagger = build_tagger(model_dir, settings.mode, pooling, settings.seed, options, settings.threads,
                              task, sentences["train"])
        result = train(tagger, sentences["train"], sentences["dev"], settings, checkpoint=checkpoint,
                       chunk_steps=chunk_steps, progress=progress, desc=run)
        with autocast(settings):
            # Each split on its own: an extra test set leaves the dev and test predictions as they were.
            predicted = {split: tagger.predict([s.doc() for s in sentences[split]], settings.eval_batch_words)
                         for split in scored}
    tagger.to("cpu")  # the pipeline file holds CPU tensors whatever the device was

    encoder = tagger.encoder.manifest.get("model", Path(model_dir).name)
    rows, scores = [], {}
    for split in scored:
        scores[split] = score_split(sentences[split], predicted[split], pred_path(out_dir, split), bootstrap,
                                    task)
        rows.append(evaluate.score_row(run, encoder, settings.mode, pooling, split, scores[split], task))
    record = {
        "run": run, "encoder": encoder, "mode": settings.mode, "pooling": pooling, "kind": tagger.kind,
        "pipeline": pipeline.FILE_NAME, "settings": dataclasses.asdict(settings),
        "encoder_options": dataclasses.asdict(options),
        "selected": {"step": result.best_step, "dev_upos": result.best_dev_upos},
        "stopped": result.stopped, "steps": result.steps, "epochs": result.epochs,
        "splits": {split: split_record(paths[split]) for split in ("train", *scored)},
        # A task other than upos is named (a run.json without one is a UPOS run's, as before tasks).
        **({} if task == DEFAULT_TASK else {"task": task, "tags": list(tagger.tags)}),
    }
    # The development score of the selected weights, recomputed from the written file, must be the
    # one that selected them; a difference would mean the weights put back are not the ones scored.
    record["dev_upos_check"] = scores["dev"].upos == result.best_dev_upos
    # Inline: the run's pipeline is the training reference (it can train further); the writeback recipe
    # writes the graph pipelines from it.
    pipeline.save(tagger, out_dir / pipeline.FILE_NAME, training={
        k: record[k] for k in ("run", "mode", "settings", "encoder_options", "selected", "stopped", "steps",
                               "epochs")})
    evaluate.write_scores(out_dir / SCORES, rows, task=task)
    files.write_text(out_dir / HISTORY, history_csv(result.history))
    files.write_json(out_dir / RUN_JSON, record)
    checkpoint.unlink(missing_ok=True)
    outputs = [out_dir / name for name in (pipeline.FILE_NAME, SCORES, "scores.md", HISTORY, RUN_JSON)]
    outputs += [pred_path(out_dir, split) for split in scored]
    return TrainedRun(rows=rows, result=result, outputs=outputs, record=record)


STOPPED = {"plateau": "--patience development evaluations without a new best",
           "maximum": "the --epochs limit", "max_steps": "the --max-steps limit"}


def check_task(task: str, sentences: dict[str, Sequence[Sentence]]) -> None:
    """Refuse a task whose column the treebank does not fill (XPOS '_'), naming the split and the fix."""
    if TASKS[task].tags is not None:
        return
    for split, found in sentences.items():
        if any(tag == "_" for s in found for tag in s.tags(task)):
            raise TrainingError(f"split {split}: words without {TASKS[task].label} (column "
                                f"{TASKS[task].column} is '_'); a {task} run needs a treebank that gives "
                                "every word one, or use task upos")


def recorded(name: str, run: TrainedRun, inputs: list, device: str) -> provenance.Done:
    """What a trained run did, for its fragment: its files, scores and development history, how it was
    selected and stopped, and in how many invocations it trained; the lines its log prints."""
    result = run.result
    task = run.record.get("task", DEFAULT_TASK)
    done = provenance.Done(inputs=list(inputs), outputs=list(run.outputs))
    done.table("Scores", evaluate.scores_markdown(run.rows, task))
    done.table("Development history", markdown_table(
        ["step", "epoch", "train loss", "dev UPOS"],
        [(h["step"], f"{h['epoch']:.2f}", f"{h['train_loss']:.4f}", f"{h['dev_upos']:.2f}")
         for h in result.history], "rrrr"))
    done.note(f"selected step {result.best_step} of {result.steps} (development UPOS "
              f"{result.best_dev_upos:.2f}); the test split and any extra test set were scored once, "
              "with those weights")
    done.note(f"stopped: {result.stopped} ({STOPPED[result.stopped]})")
    chunks = ", ".join(f"steps {c['first_step']}-{c['last_step']} in {c['seconds']:.1f} s"
                       for c in result.chunks)
    done.note(f"trained in {len(result.chunks)} invocation(s): {chunks or 'none (resumed finished)'}")
    if not run.record["dev_upos_check"]:
        done.note("WARNING: the development score of the written predictions differs from the one that "
                  "selected the weights")
    done.said.append(f"{name}: on {device}; stopped at step {result.steps} ({result.stopped}), selected step "
                     f"{result.best_step}")
    done.said += scores_said(name, run.rows, task)
    return done
