"""`encoder-study student train|export|parity`: the student recipe's commands (library: distill/).

    encoder-study student train --teacher-dir results/models/minilm --tatoeba T --udhr U \\
        --student '{"layers": 3, ...}' --training '{"steps": 300, ...}' \\
        --checkpoint results/student/checkpoints/distill.pt --out results/student/student.pt \\
        --loss-log results/student/training.csv --plot results/student/training.png --provenance P
    encoder-study student export --student results/student/student.pt --teacher-dir results/models/minilm \\
        --out-dir results/models/student --provenance P
    encoder-study student parity --student results/student/student.pt --export-dir results/models/student \\
        --texts results/texts/parity_texts.jsonl --out results/student/parity.csv --provenance P

`train` runs in chunks like `tag train`: with `chunk_steps` in the training settings it stops after
that many steps, saves its checkpoint and exits with status 75; the same command resumes it. Under
`torchrun` every rank runs the command and only rank 0 writes outputs and the provenance fragment;
there a chunk ends with status 0 (torchrun fails a job on any other), and the student file `--out`,
written only when the run is done, tells whether to run again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import files, manifest, provenance, tables

CHUNK_EXIT = 75  # EX_TEMPFAIL, as `tag train`: not finished, run again
TEACHER_FILES = (manifest.ONNX_FILE, manifest.TOKENIZER_FILE, manifest.CONFIG_FILE, manifest.MANIFEST)


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}): {text[:80]!r}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text[:80]!r}")
    return value


def _threads(value: int) -> int:
    return max(1, min(value, os.cpu_count() or 1))


def _documents(args):
    """(documents, amounts): the embedded sample's files, or the configured streamed datasets."""
    from .distill import data

    if args.streams:
        sources = [data.StreamSource.from_dict(s) for s in args.streams]
        return list(data.streamed_documents(sources)), args.amounts or None
    return data.embedded_documents(args.tatoeba, args.udhr), None


def plot_loss(rows: list[dict], path: str | os.PathLike) -> None:
    """The loss curve (total and each term) against the step, as a PNG with fixed metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .distill.objective import TERMS

    figure, axis = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    steps = [r["step"] for r in rows]
    axis.plot(steps, [r["loss"] for r in rows], label="loss", linewidth=2)
    for term in TERMS:
        axis.plot(steps, [r[term] for r in rows], label=term, linewidth=1)
    axis.set_xlabel("step")
    axis.set_ylabel("distillation loss")
    axis.set_yscale("log")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    with files.atomic_path(path) as tmp:
        # No date or software version in the file, so equal curves give equal bytes.
        figure.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(figure)


def _train(args) -> int:
    import torch

    from .distill import train

    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    training = {**args.training, "threads": threads}
    rank = int(os.environ.get("RANK", "0"))
    shown = {**provenance.settings(args, ("student", "training", "streams", "amounts")),
             "student": json.dumps(args.student, sort_keys=True),
             "training": json.dumps(training, sort_keys=True),
             "world size": os.environ.get("WORLD_SIZE", "1")}
    fragment = provenance.Fragment(args.provenance, shown, threads=threads)
    with fragment as frag:
        documents, amounts = _documents(args)
        status = train.distill(args.teacher_dir, documents, args.student, training, args.checkpoint, args.out,
                               amounts=amounts, progress=False)
        if not status.done:
            print(f"encoder-study student train: step {status.step} of {status.steps}; run again to "
                  "resume", file=sys.stderr)
            # torchrun reports any non-zero exit as a failed job, so under it a chunk ends with 0 and
            # the rule tells "more to do" from the missing output instead.
            raise _ChunkDone(0 if int(os.environ.get("WORLD_SIZE", "1")) > 1 else CHUNK_EXIT)
        if rank != 0:
            raise _NotRankZero
        rows = list(status.rows)
        train.write_log(rows, args.loss_log)
        plot_loss(rows, args.plot)
        frag.inputs += [Path(args.teacher_dir) / n for n in TEACHER_FILES]
        frag.inputs += [p for p in (args.tatoeba, args.udhr) if p]
        frag.outputs += [args.out, args.loss_log, args.plot]
        frag.table("Training log", provenance.markdown_table(
            list(train.LOG_COLUMNS), [[_short(r[c]) for c in train.LOG_COLUMNS] for r in rows]))
        frag.note(f"{len(documents)} documents; the written student is the moving average of the weights")
    return 0


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else value


class _ChunkDone(Exception):
    """A chunk ended with steps left: no fragment, exit 75."""


class _NotRankZero(Exception):
    """Ranks other than 0 write nothing."""


def _export(args) -> int:
    from .distill import export, train

    threads = _threads(args.threads)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        encoder, saved = train.load_student(args.student)
        record = export.export_student(
            encoder, args.teacher_dir, args.out_dir, name=args.name, tolerance=args.tolerance,
            threads=threads, opset=args.opset, ort_optimization=args.ort_optimization,
            distillation={"student": Path(args.student).name, "sha256": files.sha256_file(args.student),
                          "teacher": saved.get("teacher"), "steps": saved.get("steps")})
        frag.inputs += [args.student, *(Path(args.teacher_dir) / n for n in TEACHER_FILES)]
        out = Path(args.out_dir)
        frag.outputs += [out / n for n in TEACHER_FILES]
        check = record["check"]
        frag.note(f"export check, ONNX Runtime against PyTorch on a padded batch of lengths "
                  f"{check['lengths']}: max abs {check['max_abs']:.3g}, largest value "
                  f"{check['max_value']:.3g} ({check['criterion']}, tolerance {check['tolerance']})")
    return 0


def _parity(args) -> int:
    import torch

    from .data import texts
    from .distill import export, train

    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        encoder, _ = train.load_student(args.student)
        records = texts.read_jsonl(args.texts)
        rows = export.student_parity(encoder, args.export_dir, [r["text"] for r in records], threads=threads)
        files.write_text(args.out, tables.csv_text(rows, export.PARITY_COLUMNS))
        markdown = export.parity_markdown(rows)
        files.write_text(Path(args.out).with_suffix(".md"), markdown)
        frag.inputs += [args.student, args.texts, *(Path(args.export_dir) / n for n in TEACHER_FILES)]
        frag.outputs += [args.out, Path(args.out).with_suffix(".md")]
        frag.table("Student parity (one text per run, every token)", markdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`encoder-study student train|export|parity ...`: distil, export and check the student encoder."""
    parser = argparse.ArgumentParser(prog="encoder-study student", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)

    p = sub.add_parser("train", help="distil the student from the teacher (chunks: exit 75, run again)")
    provenance.add_arguments(p)
    p.add_argument("--teacher-dir", required=True, help="results/models/<teacher> (an export)")
    p.add_argument("--tatoeba", help="the embedded corpus: Tatoeba-format sentences")
    p.add_argument("--udhr", help="the embedded corpus: UDHR XML directory or zip")
    p.add_argument("--streams", type=json.loads, help="JSON list of streamed datasets (the full study)")
    p.add_argument("--amounts", type=json.loads, help="JSON object: text per language for the weights")
    p.add_argument("--student", type=_json, required=True, help="JSON: the student's shape (StudentConfig)")
    p.add_argument("--training", type=_json, default={}, help="JSON: training settings (TrainingConfig)")
    p.add_argument("--checkpoint", required=True, help="where chunks are saved; outside the outputs' dirs")
    p.add_argument("--out", required=True, help="results/student/student.pt: the EMA weights and settings")
    p.add_argument("--loss-log", required=True, help="results/student/training.csv: loss per logged step "
                   "(not --log: torchrun would take an abbreviation of its own --log-dir)")
    p.add_argument("--plot", required=True, help="results/student/training.png: the loss curve")
    p.add_argument("--threads", type=int, default=1)

    p = sub.add_parser("export", help="the student as an ONNX export beside the others")
    provenance.add_arguments(p)
    p.add_argument("--student", required=True)
    p.add_argument("--teacher-dir", required=True, help="its tokenizer.json is copied unchanged")
    p.add_argument("--out-dir", required=True, help="results/models/<name>")
    p.add_argument("--name", default="student")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--ort-optimization", default="all")
    p.add_argument("--threads", type=int, default=1)

    p = sub.add_parser("parity", help="trainable modules and ONNX Runtime against the PyTorch student")
    provenance.add_arguments(p)
    p.add_argument("--student", required=True)
    p.add_argument("--export-dir", required=True)
    p.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
    p.add_argument("--out", required=True, help="results/student/parity.csv (+ .md)")
    p.add_argument("--threads", type=int, default=1)

    args = parser.parse_args(argv)
    action = {"train": _train, "export": _export, "parity": _parity}[args.action]
    try:
        return action(args)
    except _ChunkDone as chunk:
        return chunk.args[0]
    except _NotRankZero:
        return 0
    except (ValueError, OSError, manifest.ManifestError, files.IntegrityError) as err:
        print(f"encoder-study student {args.action}: error: {err}", file=sys.stderr)
        return 2
