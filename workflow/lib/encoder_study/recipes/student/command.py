"""`encoder-study student stage|distill|export|parity`: the student recipe (library:
encoder_study.recipes.student).

    encoder-study student stage --tatoeba T --udhr U --out results/student/corpus.jsonl --provenance P
    encoder-study student stage --streams '[{"dataset": ..., "configs": {...}}]' --amounts '{...}' \\
        --out results/student/corpus.jsonl --provenance P
    encoder-study student distill --teacher-dir results/models/minilm --corpus results/student/corpus.jsonl \\
        --student '{"layers": 3, ...}' --training '{"steps": 300, "chunk_steps": 150, ...}' \\
        --checkpoint results/checkpoints/student/distill.pt --out results/student/student.pt \\
        --loss-log results/student/training.csv --plot results/student/training.png --threads 1 \\
        --device auto --precision fp32 --provenance P
    encoder-study student export --student results/student/student.pt --teacher-dir results/models/minilm \\
        --out-dir results/models/student --name student --opset 17 --tolerance 1e-4 \\
        --ort-optimization all --threads 1 --provenance P
    encoder-study student parity --student results/student/student.pt --export-dir results/models/student \\
        --texts results/texts/parity_texts.jsonl --out results/student/parity.csv --threads 1 --provenance P

`stage` runs where the network is (a local rule) and writes the documents; `distill` reads them and
needs none. `distill` saves its checkpoint every `chunk_steps` steps and goes on; run after a crash,
it resumes from the checkpoint, and once every output is written it removes it. Under `torchrun`
every rank runs the command and only rank 0 writes outputs, the provenance fragment, and removes the
checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from ... import provenance
from ...onnx import manifest


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}): {text[:80]!r}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text[:80]!r}")
    return value


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else value


def _stream_notes(frag, pinned) -> None:
    """The streamed corpus in the fragment: each dataset's commit, and whether the config pinned it (a
    commit read as the repository's current one is also printed, as the pin to give)."""
    for p in pinned:
        local, dataset, revision = p.source.local, p.source.dataset, p.source.revision
        if local is not None:  # local stand-ins (config/rehearsal.yaml): hashed
            frag.inputs += [os.path.join(local, f"{c}.jsonl") for c in sorted(p.source.configs.values())]
        elif p.given:
            frag.note(f"{dataset}: revision {revision} (pinned; the data were read at this commit)")
        else:
            frag.note(f"{dataset}: revision {revision}: the repository's current commit at this run, not "
                      "pinned; put it in the config (student.corpus.streams[].revision) to make the next run "
                      "read the same data")
            print(f"encoder-study student stage: {dataset} read at revision {revision} (not pinned: put it "
                  "in the config's student.corpus.streams[].revision)", file=sys.stderr)
    # The corpora by name (the streams' JSON is left out of the settings: long), for the report's caption.
    frag.settings["streams"] = ", ".join(
        f"{p.source.dataset} ({', '.join(sorted(p.source.configs.values()))}"
        f"{', local stand-ins' if p.source.local is not None else ''})" for p in pinned)
    frag.settings["stream revisions"] = ", ".join(
        sorted({f"{p.source.dataset}@{p.source.revision}" for p in pinned if p.source.local is None}))


def stage(args) -> int:
    """The corpus the distillation reads, written where the network is (a local rule): the streams
    pinned and read (every configuration checked first), or the embedded sample."""
    from . import sources

    shown = provenance.settings(args, ("streams", "amounts"))
    with provenance.Fragment(args.provenance, shown) as frag:
        if args.streams:
            pinned = sources.pin_streams(args.streams, args.amounts, world_size=1)
            _stream_notes(frag, pinned)
            said = lambda line: print(f"encoder-study student stage: read {line}", file=sys.stderr,  # noqa: E731
                                      flush=True)
            documents = sources.streamed_documents([p.source for p in pinned], said)
        else:
            documents = sources.embedded_documents(args.tatoeba, args.udhr)
            frag.inputs += [p for p in (args.tatoeba, args.udhr) if p]
        count = sources.write_corpus(documents, args.out)
        frag.outputs.append(args.out)
        frag.note(f"{count} documents staged in {args.out}, which student distill reads (no network there)")
    print(f"encoder-study student stage: {count} documents -> {args.out}", file=sys.stderr)
    return 0


def distill(args) -> int:
    from ...core import machine, tables
    from . import distill as library
    from . import sources

    threads = machine.torch_threads(args.threads)
    training = {**args.training, "threads": threads}
    shown = {**provenance.settings(args, ("student", "training", "amounts")),
             "student": json.dumps(args.student, sort_keys=True),
             "training": json.dumps(training, sort_keys=True),
             "world size": os.environ.get("WORLD_SIZE", "1")}
    rank_zero = int(os.environ.get("RANK", "0")) == 0
    # Ranks other than 0 train alongside and write nothing, not even the fragment.
    fragment = provenance.Fragment(args.provenance, shown, threads=threads)
    with fragment if rank_zero else contextlib.nullcontext() as frag:
        documents = sources.read_corpus(args.corpus)  # staged by `student stage`, where the network is
        rows = library.distill(args.teacher_dir, documents, args.student, training, args.checkpoint, args.out,
                               amounts=args.amounts, device=args.device, precision=args.precision,
                               progress=rank_zero)
        if frag is None:
            return 0
        library.write_log(rows, args.loss_log)
        library.plot_loss(rows, args.plot)
        frag.inputs += [Path(args.teacher_dir) / n for n in manifest.EXPORT_FILES]
        frag.inputs.append(args.corpus)
        frag.outputs += [args.out, args.loss_log, args.plot]
        frag.table("Training log", tables.markdown_table(
            list(library.LOG_COLUMNS), [[_short(r[c]) for c in library.LOG_COLUMNS] for r in rows]))
        frag.note(f"{len(documents)} documents; the written student is the moving average of the weights")
    Path(args.checkpoint).unlink(missing_ok=True)  # every output is written: nothing left to resume
    return 0


def export(args) -> int:
    from ...core import machine
    from . import export as student_export

    threads = machine.usable_threads(args.threads)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        frag.add(student_export.export_stage(args.student, args.teacher_dir, args.out_dir, name=args.name,
                                             tolerance=args.tolerance, threads=threads, opset=args.opset,
                                             ort_optimization=args.ort_optimization))
    return 0


def parity(args) -> int:
    from ...core import machine
    from . import parity as student_parity

    threads = machine.torch_threads(args.threads)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        frag.add(student_parity.table(args.student, args.export_dir, args.texts, args.out, threads))
    return 0


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="encoder-study student",
                                     description="distil, export and check the student encoder")
    sub = result.add_subparsers(required=True)

    p = sub.add_parser("stage", help="write the corpus the distillation reads, where the network is: the "
                       "streamed datasets (each configuration checked first) or the embedded sample")
    p.set_defaults(run=stage)
    provenance.add_arguments(p)
    p.add_argument("--tatoeba", help="the embedded corpus: Tatoeba-format sentences")
    p.add_argument("--udhr", help="the embedded corpus: UDHR XML directory or zip")
    p.add_argument("--streams", type=json.loads, help="JSON list of streamed datasets (the full study)")
    p.add_argument("--amounts", type=json.loads, help="JSON object: text per language for the weights")
    p.add_argument("--out", required=True, help="results/student/corpus.jsonl")

    p = sub.add_parser("distill", help="distil the student from the teacher (resumes from its checkpoint)")
    p.set_defaults(run=distill)
    provenance.add_arguments(p)
    p.add_argument("--teacher-dir", required=True, help="results/models/<teacher> (an export)")
    p.add_argument("--corpus", required=True, help="results/student/corpus.jsonl, from `student stage`")
    p.add_argument("--amounts", type=json.loads, help="JSON object: text per language for the weights "
                   "(default: the corpus's characters per language)")
    p.add_argument("--student", type=_json_object, required=True,
                   help="JSON: the student's shape (StudentConfig)")
    p.add_argument("--training", type=_json_object, required=True,
                   help="JSON: training settings (TrainingConfig)")
    p.add_argument("--checkpoint", required=True, help="saved every chunk_steps; outside the outputs' dirs")
    p.add_argument("--out", required=True, help="results/student/student.pt: the EMA weights and settings")
    p.add_argument("--loss-log", required=True, help="results/student/training.csv: loss per logged step "
                   "(not --log: torchrun would take an abbreviation of its own --log-dir)")
    p.add_argument("--plot", required=True, help="results/student/training.png: the loss curve")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), required=True,
                   help="auto: the rank's GPU when torch sees one, else the CPU; cuda refuses without one")
    p.add_argument("--precision", choices=("fp32", "bf16"), required=True,
                   help="bf16: autocast for the forward passes and the objective (weights stay float32)")

    p = sub.add_parser("export", help="the student as an ONNX export beside the others")
    p.set_defaults(run=export)
    provenance.add_arguments(p)
    p.add_argument("--student", required=True)
    p.add_argument("--teacher-dir", required=True, help="its tokenizer.json is copied unchanged")
    p.add_argument("--out-dir", required=True, help="results/models/<name>")
    p.add_argument("--name", required=True)
    p.add_argument("--opset", type=int, required=True)
    p.add_argument("--tolerance", type=float, required=True)
    p.add_argument("--ort-optimization", required=True)
    p.add_argument("--threads", type=int, required=True)

    p = sub.add_parser("parity", help="trainable modules and ONNX Runtime against transformers' BertModel "
                       "holding the student's weights")
    p.set_defaults(run=parity)
    provenance.add_arguments(p)
    p.add_argument("--student", required=True)
    p.add_argument("--export-dir", required=True)
    p.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
    p.add_argument("--out", required=True, help="results/student/parity.csv (+ .md)")
    p.add_argument("--threads", type=int, required=True)
    return result
