"""Whether a cluster can ever start each job: its CPUs, memory, runtime and GPUs against the nodes of
the partitions the job may go to, read from Slurm (`sinfo`). Slurm accepts a job that no node can hold
and leaves it PENDING (Reason=PartitionConfig) for ever, and Snakemake waits without a word, so the
workflow refuses such a run when it starts, before it submits anything, with one line per rule that
names the config key to change (workflow/rules/common.smk, `onstart`). Standard library only: the
Snakefile imports it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# One line per node and partition: partition, CPUs, memory (MB), generic resources, time limit.
SINFO = ["sinfo", "--noheader", "--Node", "--format", "%P|%c|%m|%G|%l"]


@dataclass(frozen=True)
class Node:
    partition: str
    cpus: int
    mem_mb: int
    gpus: int
    minutes: float  # the partition's time limit; inf for none


@dataclass(frozen=True)
class Request:
    rule: str
    threads: int
    mem_mb: int
    minutes: int
    gpus: int
    threads_key: str  # the config key that sets the threads


def _minutes(limit: str) -> float:
    """Slurm's time limit ([days-]hours:minutes:seconds, minutes:seconds, or minutes) in minutes."""
    limit = limit.strip()
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return float("inf")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        minutes = parts[0]
    else:
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts)
        minutes = hours * 60 + minutes + seconds / 60
    return (int(days) if days else 0) * 1440 + minutes


def _gpus(gres: str) -> int:
    """GPUs of a node's generic resources (`gpu:8`, `gpu:a100:4(S:0-1)`, `(null)`)."""
    return sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[\w.-]+)?:(\d+)", gres))


def parse_sinfo(text: str) -> list[Node]:
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        partition, cpus, mem, gres, limit = line.split("|")
        nodes.append(Node(partition.rstrip("*"), int(cpus), int(mem.rstrip("+")), _gpus(gres),
                          _minutes(limit)))
    return nodes


def read_nodes() -> list[Node] | str:
    """The cluster's nodes, or why they could not be read."""
    try:
        done = subprocess.run(SINFO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{SINFO[0]} could not run ({err})"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return f"{' '.join(SINFO)} failed: {said[-1] if said else 'no message'}"
    return parse_sinfo(done.stdout)


def candidates(request: Request, partitions: Mapping[str, Mapping]) -> list[str]:
    """The partitions the slurm executor may send the job to (profiles/slurm/partitions.yaml): a job that
    asks for GPUs, one whose max_gpu is at least that; any other, any partition (one without GPUs
    first, when it fits)."""
    if request.gpus:
        return [name for name, limits in partitions.items() if int(limits.get("max_gpu", 0)) >= request.gpus]
    return list(partitions)


def problems(requests: Iterable[Request], nodes: list[Node], partitions: Mapping[str, Mapping]) -> list[str]:
    """One line per rule whose jobs no node of their partitions can ever start."""
    lines = []
    for request in sorted(requests, key=lambda r: r.rule):
        names = candidates(request, partitions)
        pool = [n for n in nodes if n.partition in names]
        if not pool:
            lines.append(f"{request.rule}: no node in partition(s) {', '.join(names) or '(none)'} "
                         f"(profiles/slurm/partitions.yaml names {', '.join(partitions)}; sinfo shows "
                         f"{', '.join(sorted({n.partition for n in nodes}))})")
            continue
        # Per limit: what the job asks (and the key that sets it), what a node has, how the shortfall reads.
        limits = ((request.threads, "cpus", f"{request.threads} CPUs ({request.threads_key})",
                   "the largest node has"),
                  (request.mem_mb, "mem_mb", f"{request.mem_mb} MB (resources.{request.rule}.mem_mb)",
                   "the largest node has"),
                  (request.gpus, "gpus", f"{request.gpus} GPUs (resources.{request.rule}.gpu)",
                   "the largest node has"),
                  (request.minutes, "minutes", f"{request.minutes} min (resources.{request.rule}.runtime)",
                   "the limit is"))
        if any(all(getattr(n, field) >= asked for asked, field, _, _ in limits) for n in pool):
            continue
        short = []
        for asked, field, what, has in limits:
            most = max(getattr(n, field) for n in pool)
            if asked > most:  # a time limit is a float (inf: none); the rest are counts
                short.append(f"{what}, {has} {most:g}" if isinstance(most, float) else
                             f"{what}, {has} {most}")
        if not short:  # each alone fits somewhere, but no one node holds them all
            short.append(f"{request.threads} CPUs, {request.mem_mb} MB, {request.gpus} GPUs and "
                         f"{request.minutes} min together")
        lines.append(f"{request.rule} asks for {'; '.join(short)} in partition(s) {', '.join(names)}: "
                     "no node can start it; lower the request in the config or give a partition that "
                     "holds it")
    return lines
