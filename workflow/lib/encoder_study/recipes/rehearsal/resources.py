"""`rehearsal resources`: what every job of the rehearsal measured (its fragment's peak resident memory
and seconds, and Snakemake's benchmark file where the rule writes one) beside what the config's
`resources` ask for each rule; `check` refuses a request below its measured peak. A reader of the
run's record, apart from the stand-in streams the student reads."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ...core import files, tables
from ...provenance.records import records_under

COLUMNS = ["rule", "jobs", "peak_mb", "peak_from", "seconds", "mem_mb", "runtime", "mem_over_peak",
           "suggested_mem_mb", "scales_with"]


# What a rule's peak grows with (the config keys), where it is more than the model's size: the
# rehearsal keeps paper.yaml's batch sizes and lengths, so these peaks hold for a CPU run of the
# study; on a GPU the activations move to the device and the host's peak is lower.
SCALES_WITH = {
    "tagging_train": "batch_words, max_length; treebank size (frozen runs cache every word's vector); "
                     "on a GPU: device memory instead",
    "student_distill": "training.batch_windows, window_lengths, stats_windows; "
                       "on a GPU: device memory instead",
    "tagging_step_time": "tagging.step_time.batch, length",
    "parity_latency": "parity.latency_batches, latency_seq_len",
    "writeback_speed": "writeback.speed_batch_pieces",
    "writeback_pipeline": "treebank size",
    "writeback_agreement": "treebank size",
    "tagging_tables": "tagging.resamples, treebank size",
}


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def benchmark_peaks(root: str | os.PathLike) -> dict[str, list[tuple[float | None, float | None]]]:
    """rule -> (max_rss MB, seconds) of each benchmark file: `root/<rule>.tsv` or `root/<rule>/<job>.tsv`."""
    root = Path(root)
    found: dict[str, list] = {}
    for path in sorted(root.rglob("*.tsv")) if root.is_dir() else []:
        rule = path.relative_to(root).parts[0].removesuffix(".tsv")
        with open(path, encoding="utf-8", newline="") as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                found.setdefault(rule, []).append((_number(row.get("max_rss")), _number(row.get("s"))))
    return found


def fragment_peaks(root: str | os.PathLike) -> dict[str, list[tuple[float | None, float | None]]]:
    """rule -> (peak MB, seconds) of each fragment's twin under `root` (provenance/)."""
    found: dict[str, list] = {}
    for _, record in records_under(root):
        found.setdefault(record["rule"], []).append((record.get("peak_rss_mb"), record.get("seconds")))
    return found


def _max(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def suggested(peak_mb: float, margin: float, step: int = 500) -> int:
    """`peak_mb` times `margin`, rounded up to a multiple of `step` MB."""
    return int(math.ceil(peak_mb * margin / step) * step)


def resources(requests: Mapping[str, Mapping], provenance_root: str | os.PathLike,
              benchmark_root: str | os.PathLike, margin: float) -> list[dict]:
    """One row per rule that ran (a fragment or a benchmark file), sorted by rule; `requests`: rule ->
    {mem_mb, runtime} as the config's `resources` give it (the default filled in)."""
    fragments, benchmarks = fragment_peaks(provenance_root), benchmark_peaks(benchmark_root)
    rows = []
    for rule in sorted(set(fragments) | set(benchmarks)):
        from_fragment = _max(p for p, _ in fragments.get(rule, []))
        from_benchmark = _max(p for p, _ in benchmarks.get(rule, []))
        peak = _max([from_fragment, from_benchmark])
        source = ("fragment" if peak == from_fragment else "benchmark") if peak is not None else ""
        seconds = _max([s for _, s in fragments.get(rule, [])] + [s for _, s in benchmarks.get(rule, [])])
        ask = requests.get(rule, {})
        mem_mb = ask.get("mem_mb")
        rows.append({
            "rule": rule, "jobs": max(len(fragments.get(rule, [])), len(benchmarks.get(rule, []))),
            "peak_mb": None if peak is None else int(round(peak)), "peak_from": source,
            "seconds": seconds, "mem_mb": mem_mb, "runtime": ask.get("runtime"),
            "mem_over_peak": round(mem_mb / peak, 2) if mem_mb and peak else None,
            "suggested_mem_mb": suggested(peak, margin) if peak else None,
            "scales_with": SCALES_WITH.get(rule, ""),
        })
    return rows


def check(rows: Iterable[Mapping], config_name: str = "the config") -> list[str]:
    """One message per rule whose request (mem_mb) is below its measured peak."""
    return [f"rule {r['rule']}: resources.{r['rule']}.mem_mb is {r['mem_mb']} in {config_name}, below "
            f"its measured peak of {r['peak_mb']} MB; raise resources.{r['rule']}.mem_mb to at least "
            f"{r['suggested_mem_mb']}"
            for r in rows if None not in (r["peak_mb"], r["mem_mb"]) and r["mem_mb"] < r["peak_mb"]]


def below_margin(rows: Iterable[Mapping], margin: float, config_name: str = "the config") -> list[str]:
    """One message per rule whose request holds its measured peak but not the margin the config says
    requests keep (`rehearsal.margin`): a rule whose memory grew since its request was set."""
    return [f"rule {r['rule']}: resources.{r['rule']}.mem_mb is {r['mem_mb']} in {config_name}, "
            f"{r['mem_mb'] / r['peak_mb']:.2f} x its measured peak of {r['peak_mb']} MB, below the margin "
            f"{margin:g}; raise it to {r['suggested_mem_mb']}"
            for r in rows if None not in (r["peak_mb"], r["mem_mb"])
            and r["peak_mb"] <= r["mem_mb"] < r["peak_mb"] * margin]


def markdown(rows: Iterable[Mapping], margin: float) -> str:
    """The table in Markdown, with what it measured above it."""
    header = ["rule", "jobs", "peak MB", "from", "longest job s", "mem_mb asked", "runtime asked (min)",
              "asked / peak", f"peak x {margin} (MB)", "peak scales with"]
    body = [[tables.cell(r[c]) for c in COLUMNS] for r in rows]
    return tables.markdown_table(header, body, "lrrlrrrrrl")


def write(rows: list[dict], csv_path: str | os.PathLike, markdown_path: str | os.PathLike,
          margin: float) -> None:
    files.write_text(csv_path, tables.csv_text(rows, COLUMNS))
    files.write_text(markdown_path, markdown(rows, margin))

