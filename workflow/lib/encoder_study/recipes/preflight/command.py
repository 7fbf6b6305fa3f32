"""`encoder-study preflight check|verdict|device`: the preflight recipe (library:
encoder_study.recipes.preflight).

    encoder-study preflight check --config '{...the whole config...}' --requests '{"tagging_train": {...}}' \\
        --gpu-rules tagging_train,student_distill --partitions profiles/slurm/partitions.yaml \\
        --cluster none --results-dir results --out results/preflight/preflight.json \\
        --markdown results/preflight/preflight.md --provenance provenance/preflight/preflight_check.md
    encoder-study preflight verdict --table results/preflight/preflight.json
    encoder-study preflight device --runs '[{"name": ..., "model_dir": ..., ...}]' --teacher-dir D \\
        --treebank results/treebank/train.conllu --student '{...}' --training '{...}' --device auto \\
        --precision fp32 --threads 8 --out results/preflight/device.json \\
        --markdown results/preflight/device.md --provenance provenance/preflight/preflight_device.md

`check` writes the table whatever it finds (so that it stays for reading); `verdict` then prints one
line per failure (one per unreachable host) and exits with status 2 when there is any.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from ... import provenance


def parser() -> argparse.ArgumentParser:
    """`encoder-study preflight ...`: what the study will meet first, checked before it starts."""
    top = argparse.ArgumentParser(prog="encoder-study preflight", description=parser.__doc__)
    sub = top.add_subparsers(dest="subcommand", required=True)

    p = sub.add_parser("check", help="every source, the disk, the software and the cluster, into a table")
    provenance.add_arguments(p)
    p.set_defaults(run=check)
    p.add_argument("--config", type=json.loads, required=True, help="the workflow's config as JSON")
    p.add_argument("--requests", type=json.loads, required=True,
                   help="JSON: rule -> {threads, mem_mb, runtime, gpus, threads_key} of each cluster job")
    p.add_argument("--gpu-rules", default="", help="comma-separated rules whose resources ask for GPUs")
    p.add_argument("--partitions", default="", help="profiles/slurm/partitions.yaml (Slurm only)")
    p.add_argument("--cluster", choices=("none", "slurm"), required=True, help="the executor of this run")
    p.add_argument("--results-dir", required=True, help="where results/ lives (the disk check)")
    p.add_argument("--out", required=True, help="results/preflight/preflight.json")
    p.add_argument("--markdown", required=True, help="results/preflight/preflight.md")

    p = sub.add_parser("verdict", help="one line per failure of a preflight table; status 2 if any")
    p.set_defaults(run=verdict)
    p.add_argument("--table", required=True, help="results/preflight/preflight.json")

    p = sub.add_parser("device", help="one training step of each kind at the study's sizes on its device")
    provenance.add_arguments(p)
    p.set_defaults(run=device)
    p.add_argument("--runs", type=json.loads, required=True,
                   help="JSON list: each fine-tuned run's name, model_dir and settings")
    p.add_argument("--teacher-dir", required=True, help="results/models/<teacher>: the student's teacher")
    p.add_argument("--treebank", required=True, help="the train split (CoNLL-U): batches and documents")
    p.add_argument("--student", type=json.loads, required=True, help="JSON: the student's shape")
    p.add_argument("--training", type=json.loads, required=True, help="JSON: the distillation's settings")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), required=True)
    p.add_argument("--precision", choices=("fp32", "bf16"), required=True, help="the distillation's")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--out", required=True, help="results/preflight/device.json")
    p.add_argument("--markdown", required=True, help="results/preflight/device.md")
    return top


def check(args) -> int:
    from . import plan, remote, write

    shown = provenance.settings(args, ("config", "requests"))
    with provenance.Fragment(args.provenance, shown) as frag:
        client, sizes = remote.Client(), remote.Sizes()
        checks = plan.run_tasks(plan.source_tasks(args.config, client, sizes))
        checks.append(plan.disk(sizes, args.results_dir))
        checks += plan.software(args.config, [r for r in args.gpu_rules.split(",") if r])
        checks += plan.cluster_checks(args.requests, args.partitions or None, args.cluster)
        about = (f"{len(checks)} checks on the submitting host, without downloading weights; Hub endpoint "
                 f"{remote.hub_endpoint()}.")
        text = write(checks, args.out, args.markdown, about)
        frag.outputs += [args.out, args.markdown]
        frag.table("Preflight", text.split("\n\n", 2)[2])
    for c in checks:
        print(c.line())
    return 0


def verdict(args) -> int:
    from . import PreflightError, failures, read, summary

    checks = read(args.table)
    for c in checks:
        if c.status == "warning":
            print(f"preflight: warning: {c.what} ({c.where}): {c.found}", file=sys.stderr)
    lines = failures(checks)
    print(f"preflight: {summary(checks)} (the table: {args.table} and its .md)", file=sys.stderr)
    if lines:
        raise PreflightError(f"{len(lines)} failure(s):\n" + "\n".join(lines))
    return 0


def device(args) -> int:
    from ...core import machine
    from . import device as library

    threads = machine.torch_threads(args.threads)
    # Under torchrun (student.processes > 1) every rank takes part; only rank 0 writes, the fragment too.
    rank_zero = int(os.environ.get("RANK", "0")) == 0
    fragment = provenance.Fragment(args.provenance, provenance.settings(args, ("runs",)), threads=threads)
    with fragment if rank_zero else contextlib.nullcontext() as frag:
        result = library.device_check(args.runs, args.teacher_dir, args.treebank, args.student, args.training,
                                      device=args.device, precision=args.precision, seed=args.seed,
                                      threads=threads)
        if frag is None:
            return 0
        text = library.write(result, args.out, args.markdown)
        frag.outputs += [args.out, args.markdown]
        frag.inputs += [args.treebank]
        frag.table("Device check", text)
        print(text)
    return 0
