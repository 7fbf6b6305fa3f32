"""Provenance fragments: what a rule ran, on which code and machine, and the hashes of its files.

Each rule writes `provenance/<recipe>/<rule>[-<wildcards>].md` and its JSON twin
`<rule>[-<wildcards>].json`, both rendered from one record (`Fragment.record`), so they state the
same facts; the twin also holds the Markdown's SHA-256. `join` puts a recipe's fragments into its
PROVENANCE.md; `verify` reads the twins, re-hashes every file they name, and with `env=True` also
compares the recorded library versions and Python with the installed ones (the commands:
`encoder-study provenance join|verify|explain`; `explain` lives in encoder_study.lineage).
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
from importlib import metadata
from pathlib import Path

from . import __version__, files
from .errors import UserError
from .machine import cores, lifetime_peak_kib
from .tables import markdown_table

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


def read_environment(path: str | os.PathLike) -> dict:
    """An environment file (`environment_file`); ProvenanceError when it is not one."""
    data = files.read_json(path, "a run's environment file", "rerun a rule to write it again",
                           kind=dict, error=ProvenanceError)
    if data.get("format") != ENVIRONMENT_FORMAT or not isinstance(data.get("distributions"), dict):
        raise ProvenanceError(f"{path}: not an environment file (no \"format\": \"{ENVIRONMENT_FORMAT}\")")
    return data


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


def fragments_under(root: str | os.PathLike) -> list[Path]:
    """The Markdown fragments under `root` (every .md but the joined PROVENANCE.md files)."""
    return sorted(p for p in Path(root).rglob("*.md") if p.name != JOINED_NAME)


def read_record(path: str | os.PathLike) -> dict:
    """A fragment's JSON twin; ProvenanceError (naming the file and the fix) when it is not one."""
    path = Path(path)
    record = files.read_json(path, "a provenance fragment's twin", "rerun the rule that writes it",
                             error=ProvenanceError)
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ProvenanceError(f"{path}: not a provenance fragment's twin (no \"format\": "
                              f"\"{RECORD_FORMAT}\"); remove it or rerun the rule that writes it")
    return record


def records_under(root: str | os.PathLike) -> list[tuple[Path, dict]]:
    """(path, record) of every JSON twin under `root`, sorted by path; other JSON files are skipped."""
    found = []
    for path in sorted(Path(root).rglob("*.json")):
        try:
            found.append((path, read_record(path)))
        except ProvenanceError:
            if twin(path).is_file():  # a fragment's twin that is broken is an error, not another file
                raise
    return found


# `verify --fast`'s hashes, under the folder the recorded paths are relative to (see HashCache).
FAST_CACHE = ".snakemake/encoder-study/verify-hashes.json"
RACY_NS = 2_000_000_000  # a file changed this close to its hashing may change again unseen: not cached


class HashCache:
    """SHA-256 of files by their identity and state: (size, mtime_ns, ctime_ns, inode, device).

    What `verify --fast` trusts instead of reading a file again. A change keeps none of these only if
    it rewrites the file in place with the same size and then sets its mtime back; the kernel then
    still moves ctime, which no user call can set. Not kept: a file changed less than RACY_NS before
    it was hashed (a file system with coarse time stamps could change it again within the same
    tick), or changed while it was hashed. The cache file is disposable; an unreadable one is ignored.
    """

    def __init__(self, path: str | os.PathLike):
        self.path, self.hits, self.hashed, self.changed = Path(path), 0, 0, False
        try:
            data = files.read_json(self.path, "verify's hash cache", "remove it", kind=dict)
        except files.JsonError:
            data = {}
        ok = data.get("format") == 1 and isinstance(data.get("files"), dict)
        self.entries = data["files"] if ok else {}

    @staticmethod
    def _state(stat: os.stat_result) -> list[int]:
        return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]

    def sha256(self, path: Path) -> str:
        key = os.path.realpath(path)
        before = path.stat()
        entry = self.entries.get(key)
        if isinstance(entry, list) and entry[:-1] == self._state(before):
            self.hits += 1
            return entry[-1]
        started = time.time_ns()
        digest = files.sha256_file(path)
        self.hashed += 1
        after = path.stat()
        if (self._state(after) == self._state(before)
                and max(after.st_mtime_ns, after.st_ctime_ns) < started - RACY_NS):
            self.entries[key] = [*self._state(after), digest]
            self.changed = True
        elif self.entries.pop(key, None) is not None:
            self.changed = True
        return digest

    def save(self) -> None:
        """Write the cache (atomically); a folder that cannot be written leaves it as it was."""
        if not self.changed:
            return
        try:
            files.write_text(self.path, json.dumps({"format": 1, "files": self.entries}, sort_keys=True))
        except OSError:
            pass


def verify(root: str | os.PathLike, base: str | os.PathLike, env: bool = False,
           cache: HashCache | None = None) -> list[str]:
    """Re-hash every file the JSON twins name; return one line per difference (empty: all match).

    Also a difference: a Markdown fragment without its twin, a twin without its Markdown, and a
    Markdown that is not the one its twin was written with. With `env`, also each library version and
    Python version that differs from the installed one (`environment_differences`). A file named by
    several fragments is read once. With `cache` (`verify --fast`), a file whose size, times and inode
    are those it was hashed with is not read again (HashCache says what that trusts); the caller saves it.
    """
    problems: list[str] = []
    hashed: dict[tuple[int, int], str] = {}  # (device, inode) -> SHA-256: each file read once

    def sha256(target: Path) -> str:
        stat = target.stat()
        key = (stat.st_dev, stat.st_ino)
        if key not in hashed:
            hashed[key] = cache.sha256(target) if cache is not None else files.sha256_file(target)
        return hashed[key]

    environments: dict[Path, str] = {}  # a few small files every fragment names: read each once

    markdown = fragments_under(root)
    try:
        records = records_under(root)
    except ProvenanceError as err:
        return [str(err)]
    if not markdown and not records:
        return [f"{root}: no provenance fragments found; run the workflow first"]
    twins = {path for path, _ in records}
    for frag in markdown:
        if twin(frag) not in twins:
            problems.append(f"{frag}: no JSON twin ({twin(frag).name}); rerun its rule to write both")
    for path, record in records:
        frag = twin(path)
        if not frag.is_file():
            problems.append(f"{path}: its Markdown fragment {frag.name} is missing; rerun its rule")
        elif files.sha256_file(frag) != record.get("markdown", {}).get("sha256"):
            problems.append(f"{frag}: differs from the Markdown its twin {path.name} was written with; "
                            f"rerun its rule")
        if not record["files"]:
            problems.append(f"{path}: names no files")
        problems += _environment_problems(path, record, base, environments)
        for entry in record["files"]:
            name, size, digest = entry["path"], entry["bytes"], entry["sha256"]
            target = Path(base) / name
            if not target.is_file():
                problems.append(f"{path}: {name} is missing")
                continue
            actual = sha256(target)
            if actual != digest:
                # A fragment that changed under a later reader (the run crate reads every fragment)
                # was rewritten by a rerun of its own rule: the reader is stale, not the files.
                hint = (f"; {name} was rewritten by a later run of its rule, so rerun the rule that wrote "
                        f"{path.name} (`all` rebuilds the run crate)"
                        if Path(name).suffix in (".md", ".json") and Path(name).is_relative_to(root) else "")
                problems.append(f"{path}: {name} changed: recorded sha256 {digest} ({size} bytes), "
                                f"now {actual} ({target.stat().st_size} bytes){hint}")
    if env:
        problems += environment_differences([r for _, r in records], base=base)
    return problems


def _environment_problems(path: Path, record: dict, base: str | os.PathLike, hashed: dict[Path, str]
                          ) -> list[str]:
    """The environment file a twin names, missing or not the one it names (twins written before
    environment files existed name none). `hashed` keeps each file's SHA-256 across calls."""
    entry = record.get("environment")
    if entry is None:
        return []
    target = Path(base) / entry["path"]
    if not target.is_file():
        return [f"{path}: its environment file {entry['path']} is missing; rerun its rule"]
    if target not in hashed:
        hashed[target] = files.sha256_file(target)
    if hashed[target] != entry["sha256"]:
        return [f"{path}: its environment file {entry['path']} changed: recorded sha256 {entry['sha256']}, "
                f"now {hashed[target]}"]
    return []


def record_name(record: dict) -> str:
    """`<recipe>/<rule>[-<wildcards>]`: where a record's fragment lives under provenance/."""
    return f"{record['recipe']}/{record['rule']}" + (f"-{record['wildcards']}" if record["wildcards"] else "")


def environment_differences(records: list[dict], installed: dict[str, str] | None = None,
                            python: str | None = None, base: str | os.PathLike = ".") -> list[str]:
    """One line per library (and Python) whose recorded version differs from the installed one.

    Fragments may record different versions (jobs on other machines): each recorded version that
    differs is named with how many fragments and one example. Then the complete environments the
    fragments name (`environment_file`), each compared with the installed distributions: every
    version that differs, every distribution recorded but gone and every one installed since
    (`complete_differences`). `installed` (every distribution, canonical names) and `python` default
    to now.
    """
    if installed is None:
        installed = distributions()
    python = python or sys.version.split()[0]
    lines = _library_differences(records, installed, python)
    named = {line.split(":", 1)[0] for line in lines}
    return lines + [line for line in complete_differences(records, installed, python, base)
                    if line.split(":", 1)[0] not in named]


def _library_differences(records: list[dict], installed: dict[str, str], python: str) -> list[str]:
    """environment_differences for the short `libraries` list each fragment carries."""
    recorded: dict[str, dict[str, list[str]]] = {}
    for record in records:
        name = record_name(record)
        versions = {**record["libraries"], "python": record["machine"].get("python", "unknown")}
        for package, version in versions.items():
            recorded.setdefault(package, {}).setdefault(version, []).append(name)
    now = {**{p: installed.get(canonical_name(p), "not installed") for p in recorded}, "python": python}
    lines = []
    for package in sorted(recorded):
        for version, names in sorted(recorded[package].items()):
            if version != now.get(package, "not installed"):
                lines.append(f"{package}: recorded {version} by {len(names)} fragment(s) (e.g. {names[0]}), "
                             f"installed now {now.get(package, 'not installed')}")
    return lines


def complete_differences(records: list[dict], installed: dict[str, str], python: str,
                         base: str | os.PathLike = ".") -> list[str]:
    """Each complete environment the fragments name against `installed` (canonical name -> version)
    and `python`: one line per difference, naming the file and how many fragments ran in it."""
    users: dict[str, list[str]] = {}
    for record in records:
        if record.get("environment"):
            users.setdefault(record["environment"]["path"], []).append(record_name(record))
    lines = []
    for path, names in sorted(users.items()):
        where = f"in {path} ({len(names)} fragment(s), e.g. {names[0]})"
        try:
            recorded = read_environment(Path(base) / path)
        except ProvenanceError as err:
            lines.append(f"environment: {err}")
            continue
        then = {**recorded["distributions"], "python": recorded.get("python", "unknown")}
        now = {**installed, "python": python}
        for name in sorted(then.keys() | now.keys()):
            if name not in now:
                lines.append(f"{name}: recorded {then[name]} {where}, not installed now")
            elif name not in then:
                lines.append(f"{name}: installed now {now[name]}, not in the environment recorded {where}")
            elif then[name] != now[name]:
                lines.append(f"{name}: recorded {then[name]} {where}, installed now {now[name]}")
    return lines


def join(recipe: str, fragments: list[str | os.PathLike], target: str | os.PathLike) -> None:
    """Write a recipe's PROVENANCE.md: a contents list, then every fragment in the order given."""
    fragments = [Path(f) for f in fragments]
    parts = [
        f"# Provenance of the `{recipe}` recipe\n\n",
        "Fragments in the order the workflow runs them; `snakemake --cores 1 verify` (or `encoder-study "
        "provenance verify --root provenance --base .`) re-hashes every file they name.\n\n",
        "".join(f"- [{f.stem}](#{f.stem.lower()})\n" for f in fragments),
    ]
    for f in fragments:
        body = f.read_text(encoding="utf-8")
        # Demote headings one level so the recipe's title stays the only top-level heading.
        body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE)
        parts += ["\n", f'<a id="{f.stem.lower()}"></a>\n\n', body]
    files.write_text(target, "".join(parts))


def add_arguments(parser) -> None:
    """The argument every rule's command takes: where its fragment goes (which also names the rule)."""
    parser.add_argument("--provenance", required=True,
                        help="fragment to write: provenance/<recipe>/<rule>[-<wildcards>].md")


def settings(args, skip: tuple[str, ...] = ()) -> dict:
    """A command's arguments as the fragment's Settings table, without the provenance plumbing (and
    without `run`, the function a subcommand names: cli.py's dispatch, not a setting)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in ("provenance", "run", *skip)}
