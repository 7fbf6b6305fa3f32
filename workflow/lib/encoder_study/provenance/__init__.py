"""Provenance fragments: what a rule ran, on which code and machine, and the hashes of its files.

Each rule writes `provenance/<recipe>/<rule>[-<wildcards>].md` and its JSON twin
`<rule>[-<wildcards>].json`, both rendered from one record (`Fragment.record`), so they state the
same facts; the twin also holds the Markdown's SHA-256.

This package's own module is the writer that every job runs, so it stays small and stable; the
readers live beside it and no job imports them, so a fix to one reruns no job: `records` (reading
twins), `verify`, `join` (a recipe's PROVENANCE.md), `lineage` (`explain`), `crate` (the run crate),
`recorded` (the check before a run); `artefacts` seals checkpoints and pipelines; `deps` gives rules
their code inputs (docs/reruns.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .. import __version__
from ..core import files
from ..core.errors import UserError
from ..core.machine import cores, lifetime_peak_kib
from ..core.tables import markdown_table

LIBRARIES = (
    "torch", "transformers", "tokenizers", "onnx", "onnxruntime", "numpy",
    "scipy", "snakemake", "huggingface-hub", "safetensors", "spacy", "encoder-study",
)
FILES_HEADING = "## Files"
JOINED_NAME = "PROVENANCE.md"
# Marks a JSON file as a fragment's twin (other JSON may live under provenance/ one day).
RECORD_FORMAT = "encoder-study provenance fragment 1"
# The complete environments fragments name live in <fragments' root>/environments/<sha256>.json.
ENVIRONMENTS = "environments"
ENVIRONMENT_FORMAT = "encoder-study environment 1"


class ProvenanceError(UserError):
    pass


def library_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    versions = {}
    for name in sorted(names):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def canonical_name(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503): `Huggingface_Hub` is `huggingface-hub`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions() -> dict[str, str]:
    """Every installed distribution (canonical name -> version), as importlib.metadata finds them: where
    one is installed twice, the first on sys.path, the one `import` and metadata.version see."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical_name(name), dist.version)
    return dict(sorted(found.items()))


def environment_file(root: str | os.PathLike) -> tuple[dict, str]:
    """The complete environment (Python and every distribution) as the text of its file under
    `<root>/environments/`, named by its SHA-256, and the fragment's entry pointing at it.

    Every job of a run in one environment names the same file, so the run records it once; a job
    elsewhere (another node, another venv) names its own. Fragments keep their short `libraries`."""
    found = distributions()
    text = json.dumps({"format": ENVIRONMENT_FORMAT, "python": sys.version.split()[0],
                       "distributions": found}, indent=1, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    path = normal_path(Path(root) / ENVIRONMENTS / f"{digest}.json")
    return {"path": path.as_posix(), "sha256": digest, "distributions": len(found)}, text


def code_state(root: str | os.PathLike = ".") -> dict:
    """{"commit", "dirty", "changed_files"}; commit None outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = [line for line in git("status", "--porcelain").splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None, "changed_files": None}
    return {"commit": commit, "dirty": bool(changed), "changed_files": len(changed)}


def describe_code(state: dict) -> str:
    """`<commit> (clean)` or `<commit> (dirty: N files)`; `not a git checkout` outside one."""
    if state["commit"] is None:
        return "not a git checkout"
    return f"{state['commit']} (clean)" if not state["dirty"] else \
        f"{state['commit']} (dirty: {state['changed_files']} files)"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, str]:
    return {
        "cpu": cpu_model(),
        "cores": str(cores()),  # the CPU affinity: what this job's threads are clamped to
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


# CPU features that decide which matrix kernels PyTorch and ONNX Runtime pick (x86 `flags`, Arm
# `Features`); the rest of /proc/cpuinfo's list says nothing about the numbers or the timings.
SIMD_FLAG_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "vnni", "asimd", "sve", "bf16", "i8mm")
NVIDIA_SMI_TIMEOUT_S = 10
# What a command's code reports it used, e.g. "onnxruntime providers" or "torch device": key -> values.
_USED: dict[str, set[str]] = {}


def used(key: str, value: str) -> None:
    """Record, for this process's fragment, a device fact the code chose (the ONNX Runtime execution
    provider of a session, the torch device and precision of a run); `device()` lists every value."""
    _USED.setdefault(key, set()).add(str(value))


def cpu_flags(cpuinfo: str | None = None) -> str:
    """The SIMD and matrix flags of the first CPU in /proc/cpuinfo, sorted; "unknown" without it."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = sorted({f for f in value.split() if f.startswith(SIMD_FLAG_PREFIXES)})
            return " ".join(flags) or "none"
    return "unknown"


def nvidia_gpus() -> dict[str, str]:
    """GPU names, memory and driver from `nvidia-smi`; says so, without failing, when there is none.

    nvidia-smi rather than torch: asking torch for device names initialises CUDA in the job (a
    context, memory, a second or more), and jobs that never import torch would have to.
    """
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except FileNotFoundError:
        return {"gpus": "none (no nvidia-smi)"}
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"gpus": f"unknown (nvidia-smi failed: {err})"}
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        return {"gpus": f"none (nvidia-smi exit {done.returncode}: {reason[0] if reason else 'no message'})"}
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if not rows:
        return {"gpus": "none (nvidia-smi lists no GPU)"}
    return {"gpus": "; ".join(f"{r[0]}: {r[1]} ({r[2]})" if len(r) >= 3 else ", ".join(r) for r in rows),
            "gpu driver": ", ".join(sorted({r[3] for r in rows if len(r) >= 4})) or "unknown"}


def device() -> dict[str, str]:
    """The device facts of this process, for every fragment (the CPU model is in `machine`): its SIMD
    flags, the GPUs and
    driver (nvidia-smi), the CUDA devices this job may see, torch's CUDA build and availability and
    ONNX Runtime's providers (each only when the command imported the library: importing torch costs
    about a second per job), and what the code reported it used (`used`)."""
    facts = {"cpu flags": cpu_flags(), **nvidia_gpus(),
             "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "unset")}
    torch = sys.modules.get("torch")
    if torch is None:
        facts["torch CUDA"] = "torch not imported by this command"
    else:
        available = torch.cuda.is_available()  # counts devices; no CUDA context is created
        facts["torch CUDA"] = (f"available, {torch.cuda.device_count()} device(s)" if available
                               else "not available")
        facts["torch CUDA build"] = torch.version.cuda or "none (CPU build)"
    ort = sys.modules.get("onnxruntime")
    facts["onnxruntime providers available"] = (", ".join(ort.get_available_providers()) if ort is not None
                                                else "onnxruntime not imported by this command")
    for key in sorted(_USED):
        facts[key] = ", ".join(sorted(_USED[key]))
    return facts


def peak_rss_mb() -> int:
    """The most resident memory (MB) this process, or a child it waited for, has held: the kernel's
    high-water marks (machine.lifetime_peak_kib, ru_maxrss of the children), which Snakemake's
    benchmark (sampled every 30 s) can miss."""
    import resource

    kib = max(lifetime_peak_kib(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return round(kib * 1024 / 1e6)


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        out.extend(files.list_files(p) if p.is_dir() else [p])
    return out


def normal_path(path: str | os.PathLike) -> Path:
    """`path` without `..` segments, naming the same file: `a/x/../b` is `a/b` unless `x` is a link
    (then the real path, relative to the working directory when it lies inside it)."""
    path = Path(path)
    if ".." not in path.parts:
        return path
    plain = Path(os.path.normpath(path))
    if not path.exists() or (plain.exists() and os.path.samefile(path, plain)):
        return plain  # the same file, or nothing there to follow
    real = Path(os.path.realpath(path))
    inside = Path(os.path.relpath(real))
    return real if path.is_absolute() or ".." in inside.parts else inside


@dataclass
class Done:
    """What a stage did, for its command to record in the fragment (`Fragment.add`): the files it read
    and wrote, its tables (title, Markdown), its notes, and the lines the command prints to the job's
    log. A stage returns it; a command only records and prints."""

    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    tables: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def table(self, title: str, markdown: str) -> None:
        self.tables.append((title, markdown))

    def note(self, text: str) -> None:
        self.notes.append(text)


class Fragment:
    """Collects what one rule did and writes its fragment atomically.

    Use as a context manager around the rule's work; the fragment is written only on success,
    after the outputs exist, so its hashes are those of the finished files.
    """

    def __init__(self, path: str | os.PathLike, settings: dict | None = None,
                 threads: int | None = None, argv: list[str] | None = None):
        self.path = Path(path)
        # Rule names are identifiers, so the first '-' of the stem starts the wildcards.
        self.rule, _, self.wildcards = self.path.stem.partition("-")
        self.settings = dict(settings or {})
        self.threads = threads
        self.argv = list(sys.argv if argv is None else argv)
        self.inputs: list[str | os.PathLike] = []
        self.outputs: list[str | os.PathLike] = []
        self.notes: list[str] = []
        self.tables: list[tuple[str, str]] = []

    def __enter__(self) -> Fragment:
        self.started = dt.datetime.now(dt.UTC)
        files.CHECKED.clear()  # what the job checks from here on is what it reads (file_rows)
        _USED.clear()  # device facts told before this fragment opened belong to no fragment
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.write()
        _USED.clear()  # the device facts belong to this fragment; a next one in the process starts afresh
        files.CHECKED.clear()
        return False

    def table(self, title: str, markdown: str) -> None:
        self.tables.append((title, markdown))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def add(self, done: Done) -> Done:
        """Record what a stage did (its files, tables and notes, in its order); returns it."""
        self.inputs += done.inputs
        self.outputs += done.outputs
        self.tables += done.tables
        self.notes += done.notes
        return done

    def record(self) -> dict:
        """Every fact of the fragment as JSON-ready data: what the twin holds and the Markdown shows."""
        finished = dt.datetime.now(dt.UTC)
        program = Path(self.argv[0]).name if self.argv else ""
        if program in ("cli.py", "encoder-study"):  # the entry point re-executes itself as cli.py
            program = "encoder-study"
        argv = [program, *self.argv[1:]] if self.argv else []
        self._environment = environment_file(self.path.parent.parent)
        return {
            "format": RECORD_FORMAT,
            "rule": self.rule,
            "recipe": self.path.parent.name,
            "wildcards": self.wildcards,
            "command": shlex.join(argv),
            "argv": argv,
            "code": code_state(),
            "version": __version__,
            "started": self.started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - self._t0, 1),
            "peak_rss_mb": peak_rss_mb(),
            "threads": self.threads,
            "machine": machine(),
            "device": device(),
            "settings": {k: _jsonable(v) for k, v in sorted(self.settings.items())},
            "libraries": library_versions(),
            "environment": self._environment[0],
            "files": self.file_rows(),
            "tables": [{"title": t, "markdown": m} for t, m in self.tables],
            "notes": list(self.notes),
        }

    def file_rows(self) -> list[dict]:
        """Each input, then each output, once, with its bytes and SHA-256; paths without `..`.

        The inputs are those the command named and every file it checked against a recorded hash
        (files.CHECKED: a model's weights behind its source.json, an export behind a pipeline), but
        not a checked file the job itself wrote."""
        own = {self.path.resolve(), twin(self.path).resolve()}
        outputs = [normal_path(p) for p in _expand(self.outputs)]
        written = {p.resolve() for p in outputs}
        checked = [p for p in files.CHECKED if p.is_file() and p.resolve() not in written]
        inputs = [normal_path(p) for p in _expand([*self.inputs, *checked])]
        rows = []
        for role, paths in (("input", inputs), ("output", outputs)):
            seen = set(own)
            for p in paths:
                if p.resolve() in seen:
                    continue
                seen.add(p.resolve())
                rows.append({"role": role, "path": p.as_posix(), "bytes": p.stat().st_size,
                             "sha256": files.sha256_file(p)})
        return rows

    def render(self, record: dict | None = None) -> str:
        return render(self.record() if record is None else record)

    def write(self) -> None:
        """The Markdown first, then its twin, which names the Markdown's SHA-256: a twin exists only
        beside the finished Markdown it describes."""
        record = self.record()
        entry, environment_text = self._environment
        target = Path(entry["path"])
        if not (target.is_file() and files.sha256_file(target) == entry["sha256"]):
            files.write_text(target, environment_text)  # one file per environment, shared by fragments
        text = render(record)
        files.write_text(self.path, text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        record["markdown"] = {"path": self.path.name, "sha256": digest}
        files.write_text(twin(self.path), json.dumps(record, indent=2) + "\n")


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


# Sections the Markdown shows in its header table or in sections of their own; any other mapping a
# record carries (the device, say) gets a "what | value" section titled after its key.
_SHOWN = {"format", "rule", "recipe", "wildcards", "command", "argv", "code", "version", "started",
          "finished", "seconds", "peak_rss_mb", "threads", "machine", "settings", "libraries", "files",
          "tables", "notes", "markdown"}


def render(record: dict) -> str:
    """A fragment's Markdown from its record (`Fragment.record`)."""
    wildcards = record["wildcards"]
    title = record["rule"] + (f" ({wildcards})" if wildcards else "")
    about = [
        ("rule", record["rule"]),
        ("recipe", record["recipe"]),
        ("wildcards", wildcards or "none"),
        ("command", f"`{record['command']}`"),
        ("code", describe_code(record["code"])),
        ("encoder-study version", record["version"]),
        ("started (UTC)", record["started"]),
        ("finished (UTC)", record["finished"]),
        ("seconds", f"{record['seconds']:.1f}"),
        *([("peak resident memory (MB)", record["peak_rss_mb"])] if "peak_rss_mb" in record else []),
        ("threads", record["threads"] if record["threads"] is not None else "default"),
        *record["machine"].items(),
    ]
    parts = [f"# {title}\n\n", markdown_table(["what", "value"], about)]
    for key in sorted(k for k, v in record.items() if k not in _SHOWN and isinstance(v, dict)):
        parts += [f"\n## {key.capitalize()}\n\n",
                  markdown_table(["what", "value"], [(k, str(v)) for k, v in record[key].items()])]
    if record["settings"]:
        parts += ["\n## Settings\n\n", markdown_table(
            ["setting", "value"], [(k, str(v)) for k, v in record["settings"].items()])]
    parts += ["\n## Libraries\n\n", markdown_table(["package", "version"], record["libraries"].items())]
    rows = [(f["role"], f["path"], f["bytes"], f["sha256"]) for f in record["files"]]
    parts += [f"\n{FILES_HEADING}\n\n", markdown_table(["role", "path", "bytes", "sha256"], rows, "llrl")]
    for table in record["tables"]:
        parts += [f"\n## {table['title']}\n\n", table["markdown"]]
    if record["notes"]:
        parts += ["\n## Notes\n\n", "".join(f"- {n}\n" for n in record["notes"])]
    return "".join(parts)


def twin(fragment: str | os.PathLike) -> Path:
    """The JSON twin of a fragment's Markdown (and the Markdown of a twin): same stem, other suffix."""
    fragment = Path(fragment)
    return fragment.with_suffix(".md" if fragment.suffix == ".json" else ".json")


def add_arguments(parser) -> None:
    """The argument every rule's command takes: where its fragment goes (which also names the rule)."""
    parser.add_argument("--provenance", required=True,
                        help="fragment to write: provenance/<recipe>/<rule>[-<wildcards>].md")


def settings(args, skip: tuple[str, ...] = ()) -> dict:
    """A command's arguments as the fragment's Settings table, without the provenance plumbing (and
    without `run`, the function a subcommand names: cli.py's dispatch, not a setting)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in ("provenance", "run", *skip)}
