"""The Workflow Run RO-Crate of a run: `ro-crate-metadata.json`, built from the fragments' JSON twins,
and its SHA-256, the run's digest, which a paper cites and `verify --digest` checks.

It follows the Provenance Run Crate profile 0.5 (https://w3id.org/ro/wfrun/provenance/0.5, on RO-Crate
1.1; also Workflow Run Crate, Process Run Crate and Workflow RO-Crate 1.0), the version roc-validator
checks:

- the workflow (the Snakefile: File, SoftwareSourceCode, ComputationalWorkflow, HowTo) in Snakemake,
  with the package's version, one input and one output parameter (the files the run read that no job
  wrote, and those it left that no job read);
- each rule as a step (HowToStep) and a tool (SoftwareApplication, with the libraries its jobs
  recorded as softwareRequirements, each by its PyPI release);
- each job (one fragment) as a CreateAction: its tool as instrument, the person who ran the workflow
  as agent, its inputs as object, its outputs as result (File entities with contentSize and sha256;
  a job that writes only its fragment, a check, has the fragment as result), start and end, the
  command as description, its wall time as resourceUsage and its two fragment files (Markdown and JSON
  twin) as subjectOf; a ControlAction ties it to its step;
- the run as a CreateAction of the workflow (object: files no job wrote, and the config files; result:
  files no job read), and an OrganizeAction with Snakemake (the versions the fragments record) as
  instrument;
- hashed when the crate is built: the workflow's code and configs (rules, package, schemas, captions,
  config/, envs/), the README, the citation and licence, the joined PROVENANCE.md files and the
  report's pages, so that `verify` checks them too.

Where the crate sits: at the top of the workflow's working directory (the repository root), beside
results/ and provenance/, not inside either. RO-Crate requires the main workflow file inside the crate
(Workflow RO-Crate; roc-validator checks it) and its 1.1 JSON-LD appendix says an `@id` should not
include `../`; the Snakefile, results/ and provenance/ share only the working directory. Paths the
fragments record are relative to that directory (`base`), so they are the ids as they stand. A file
outside it (an absolute path to a local copy of a data set) gets a local `#` id naming its path: it is
described, with its hash, but not part of the crate's payload (RO-Crate 1.2's rule for such files).

Absolute ids and urls for the workflow's own tools need a public address of its code: CITATION.cff's
`repository-code` (else `url`). Without one the tools keep local `#tool-` ids, and the workflow claims
no Bioschemas conformance (whose minimum includes a url).

The crate states what the fragments state; `encoder-study provenance verify` re-hashes the files
(`check` here re-hashes those the crate lists). Its own job's fragment is not in it (that fragment
hashes the crate). Every list is sorted, so the same fragments give the same bytes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import yaml

from .. import provenance
from ..core import files
from ..core.errors import UserError
from .records import read_record, record_name
from .verify import HashCache

CRATE_NAME = "ro-crate-metadata.json"
# The run's digest: the crate's SHA-256, in sha256sum's format (`sha256sum -c` checks it).
DIGEST_NAME = "ro-crate-metadata.sha256"
CONTEXT = ["https://w3id.org/ro/crate/1.1/context", "https://w3id.org/ro/terms/workflow-run/context"]
RO_CRATE = "https://w3id.org/ro/crate/1.1"
WORKFLOW_RO_CRATE = "https://w3id.org/workflowhub/workflow-ro-crate/1.0"
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
    "https://w3id.org/ro/wfrun/provenance/0.5": "Provenance Run Crate",
    WORKFLOW_RO_CRATE: "Workflow RO-Crate",
}
BIOSCHEMAS_WORKFLOW = "https://bioschemas.org/profiles/ComputationalWorkflow/1.0-RELEASE"
SNAKEMAKE_LANGUAGE = "https://w3id.org/workflowhub/workflow-ro-crate#snakemake"
SNAKEMAKE_URL = "https://snakemake.readthedocs.io"
PYPI = "https://pypi.org/project/"
PYTHON_URL = "https://www.python.org/"
# The workflow's own package: its files are in the crate, its version is the workflow's.
OWN_PACKAGE = "encoder-study"
# A string, as the Workflow Run Crate examples write it and roc-validator checks it.
COMPLETED = "http://schema.org/CompletedActionStatus"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Media types of the files the workflow writes and is made of, by suffix (then by name); a fixed table
# rather than the mimetypes module, whose answers depend on the machine's /etc/mime.types (the crate
# must not). Anything else is application/octet-stream: every file gets an encodingFormat.
MEDIA_TYPES = {
    ".csv": "text/csv", ".tsv": "text/tab-separated-values", ".md": "text/markdown", ".html": "text/html",
    ".json": "application/json", ".jsonl": "application/jsonl", ".txt": "text/plain",
    ".conllu": "text/plain", ".xml": "application/xml", ".png": "image/png", ".svg": "image/svg+xml",
    ".onnx": "application/octet-stream", ".safetensors": "application/octet-stream",
    ".pt": "application/octet-stream", ".zip": "application/zip", ".gz": "application/gzip",
    ".py": "text/x-python", ".smk": "text/x-snakemake", ".yaml": "application/yaml",
    ".yml": "application/yaml", ".cff": "application/yaml", ".toml": "application/toml",
    ".sh": "application/x-sh", ".rst": "text/x-rst", ".sha256": "text/plain", ".log": "text/plain",
}
MEDIA_TYPES_BY_NAME = {"Snakefile": "text/x-snakemake", "LICENSE": "text/plain"}
OTHER_MEDIA_TYPE = "application/octet-stream"
UNKNOWN_AGENT = "unknown"


class CrateError(UserError):
    pass


def media_type(path: str) -> dict:
    """{"encodingFormat": ...} of a file, by its suffix, else its name, else octet-stream."""
    name = Path(path).name
    found = MEDIA_TYPES.get(Path(name).suffix.lower()) or MEDIA_TYPES_BY_NAME.get(name, OTHER_MEDIA_TYPE)
    return {"encodingFormat": found}


def ref(entity_id: str) -> dict:
    return {"@id": entity_id}


def refs(ids: Iterable[str]) -> dict | list[dict]:
    """References to `ids`, sorted, once each: one reference alone, not a list of one (RO-Crate 1.1's
    JSON-LD recommendation)."""
    found = [ref(i) for i in sorted(set(ids))]
    return found[0] if len(found) == 1 else found


def ids_of(value: dict | list[dict] | None) -> list[str]:
    """The ids a property refers to, whether it holds one reference or a list (readers of the crate)."""
    if value is None:
        return []
    return [v["@id"] for v in (value if isinstance(value, list) else [value])]


def local_id(kind: str, name: str) -> str:
    """A `#` id for an entity that is no file of the crate: `#<kind>-<name>`, escaped as a URI."""
    return f"#{kind}-{quote(name, safe='/+-._~')}"


# -- reading the fragments -------------------------------------------------------------------------

def _fail(path: Path, field: str, problem: str) -> CrateError:
    return CrateError(f"{path}: field {field!r} {problem}; the twin is not as the rule wrote it: "
                      "rerun the rule that writes it (snakemake --forcerun <rule>)")


def _check_time(path: Path, record: dict, field: str) -> None:
    value = record.get(field)
    if not isinstance(value, str):
        raise _fail(path, field, "is missing" if value is None else "is not a string")
    try:
        dt.datetime.fromisoformat(value)
    except ValueError as err:
        raise _fail(path, field, f"is not an ISO 8601 time ({value!r})") from err


def check_record(path: str | os.PathLike, record: dict) -> None:
    """CrateError naming the twin, the field and the fix when a fact the crate needs is missing or
    malformed (a twin edited by hand, or written by another version of the package)."""
    path = Path(path)
    for field in ("rule", "recipe", "wildcards", "command", "version"):
        if not isinstance(record.get(field), str):
            raise _fail(path, field, "is missing" if field not in record else "is not a string")
    if not record["rule"]:
        raise _fail(path, "rule", "is empty")
    for field in ("started", "finished"):
        _check_time(path, record, field)
    for field in ("libraries", "machine"):
        value = record.get(field)
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _fail(path, field, "is missing" if value is None else "is not a mapping of strings")
    code = record.get("code")
    if not isinstance(code, dict) or not {"commit", "dirty", "changed_files"} <= set(code):
        raise _fail(path, "code", "is missing" if code is None else "lacks commit, dirty or changed_files")
    if "threads" not in record or not (record["threads"] is None or isinstance(record["threads"], int)):
        raise _fail(path, "threads", "is missing" if "threads" not in record else "is not a count or null")
    if not isinstance(record.get("seconds"), (int, float)):
        raise _fail(path, "seconds", "is missing" if "seconds" not in record else "is not a number")
    entries = record.get("files")
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "files", "is missing" if entries is None else "lists no files")
    for i, entry in enumerate(entries):
        where = f"files[{i}]"
        if not isinstance(entry, dict):
            raise _fail(path, where, "is not a mapping")
        if entry.get("role") not in ("input", "output"):
            raise _fail(path, f"{where}.role", f"is {entry.get('role')!r}, not 'input' or 'output'")
        if not isinstance(entry.get("path"), str) or not entry["path"]:
            raise _fail(path, f"{where}.path", "is missing or empty")
        if not isinstance(entry.get("bytes"), int) or isinstance(entry["bytes"], bool) or entry["bytes"] < 0:
            raise _fail(path, f"{where}.bytes", f"is {entry.get('bytes')!r}, not a byte count")
        if not isinstance(entry.get("sha256"), str) or not SHA256.match(entry["sha256"]):
            raise _fail(path, f"{where}.sha256", f"is {entry.get('sha256')!r}, not a SHA-256 in hex")


def read_fragments(fragments: Iterable[str | os.PathLike]) -> list[tuple[Path, dict]]:
    """(twin, record) of each fragment (its Markdown or its JSON twin may be named), sorted by path,
    each checked (`check_record`); a fragment named twice counts once."""
    twins = sorted({provenance.twin(f) if Path(f).suffix == ".md" else Path(f) for f in fragments})
    if not twins:
        raise CrateError("no fragments given: name the fragments' Markdown files or JSON twins "
                         "(provenance/<recipe>/<rule>[-<wildcards>].md)")
    found = []
    for twin in twins:
        record = read_record(twin)
        check_record(twin, record)
        found.append((twin, record))
    return found


# -- who ran it, and what the crate describes beside the fragments ------------------------------------

def git_author(base: str | os.PathLike) -> str | None:
    """git's author identity in `base` ("Name <email>", as a commit there would record it), or None
    when git is missing or has none."""
    try:
        found = subprocess.run(["git", "var", "GIT_AUTHOR_IDENT"], cwd=base, capture_output=True,
                               text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.fullmatch(r"(.*>)\s+\d+\s+[+-]\d{4}", found)  # drop the time git appends
    return match[1] if match else None


def agent_entity(agent: str | None, base: str | os.PathLike) -> dict:
    """The Person who ran the workflow, the agent of every action: `agent` ("Name", "Name <email>",
    optionally with an ORCID URL), else git's author identity, else recorded as unknown."""
    source = "given as the config's provenance.agent or --agent"
    if not (agent or "").strip():
        agent, source = git_author(base), "git's author identity where the crate was built"
    if not agent:
        return {"@id": local_id("agent", UNKNOWN_AGENT), "@type": "Person", "name": UNKNOWN_AGENT,
                "description": "Who ran the workflow is not recorded: no provenance.agent in the config, "
                               "no --agent, and no git author identity."}
    orcid = re.search(r"https://orcid\.org/\d{4}-\d{4}-\d{4}-\d{3}[\dX]", agent)
    text = agent.replace(orcid[0], "") if orcid else agent
    match = re.fullmatch(r"\s*(.*?)\s*<([^<>\s]+)>\s*", text)
    name, email = (match[1], match[2]) if match else (text.strip(), None)
    name = name.strip(" ()") or (email or orcid[0])
    entity = {"@id": orcid[0] if orcid else local_id("agent", name), "@type": "Person", "name": name,
              "description": f"Ran the workflow ({source})."}
    if email:
        entity["email"] = email
    return entity


@dataclass
class Sources:
    """The files the crate describes beside the fragments, hashed when it is built: the workflow (the
    Snakefile), its citation, licence and README, its code and configs, the documents made from the
    fragments and results (joined PROVENANCE.md files, the report's pages), and the config files the
    run was given (also inputs of the run)."""

    workflow: Path
    citation: Path
    license: Path
    readme: Path
    code: list[Path] = dataclasses.field(default_factory=list)
    documents: list[Path] = dataclasses.field(default_factory=list)
    configfiles: list[Path] = dataclasses.field(default_factory=list)


# -- the crate -------------------------------------------------------------------------------------

def _file_id(path: str | os.PathLike, base: Path) -> tuple[str, bool]:
    """(id, inside) of a file (a path relative to `base`, or absolute): its path relative to the
    crate's root, or a `#` id naming its absolute path when it lies outside."""
    root = os.path.abspath(base)
    full = os.path.abspath(os.path.join(root, path))
    relative = os.path.relpath(full, root)
    if relative == ".." or relative.startswith(".." + os.sep):
        return local_id("file", Path(full).as_posix()), False
    return quote(Path(relative).as_posix(), safe="/+-._~"), True


def _citation(path: Path) -> dict:
    try:
        cff = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise CrateError(f"{path}: cannot read the citation file ({err}); it names the study's title, "
                         "authors and licence") from err
    missing = [k for k in ("title", "license", "authors") if not cff or not cff.get(k)]
    if missing:
        raise CrateError(f"{path}: no {', '.join(missing)}; the crate takes them from the citation file")
    return cff


def code_url(cff: dict) -> str | None:
    """Where the workflow's code is published: CITATION.cff's `repository-code`, else its `url`."""
    for key in ("repository-code", "url"):
        if str(cff.get(key, "")).startswith(("https://", "http://")):
            return str(cff[key])
    return None


def _authors(cff: dict) -> list[dict]:
    """The citation's authors; each one's `website` (CFF), else the code's address, as its url."""
    entities = []
    for i, author in enumerate(cff["authors"], 1):
        if "name" in author:  # an entity (a group), in CFF's terms
            entity = {"@type": "Organization", "name": author["name"]}
        else:
            names = [str(author[k]) for k in ("given-names", "family-names") if k in author]
            entity = {"@type": "Person", "name": " ".join(names)}
        entity["@id"] = author.get("orcid") or local_id("author", str(i))
        url = author.get("website") or (code_url(cff) if entity["@type"] == "Organization" else None)
        if url:
            entity["url"] = str(url)
        entities.append(entity)
    return entities


def _one_or_all(values: Iterable[str]) -> str:
    """One recorded value, or every distinct one (jobs run with different versions), sorted."""
    return ", ".join(sorted(set(values)))


def _pypi_id(name: str, version: str) -> str:
    return f"{PYPI}{quote(name)}/{quote(version, safe='')}/"


class _Graph:
    """The crate's entities by @id as they are added, the ids of the files in its payload (hasPart),
    and the @id of each file the fragments record, by its path as recorded."""

    def __init__(self, base: Path, tools_url: str | None) -> None:
        self.base, self.tools_url, self.agent = base, tools_url, ""
        self.entities: dict[str, dict] = {}
        self.has_part: set[str] = set()
        self.file_ids: dict[str, str] = {}

    def add(self, entity: dict) -> str:
        old = self.entities.get(entity["@id"])
        if old is not None and old != entity:
            raise AssertionError(f"two different entities with @id {entity['@id']}")
        self.entities[entity["@id"]] = entity
        return entity["@id"]

    def add_file(self, entity: dict, inside: bool) -> str:
        if inside:
            self.has_part.add(entity["@id"])
        return self.add(entity)

    def add_current(self, path: str | os.PathLike, name: str) -> str:
        """A file hashed now (a path from the working directory); one a fragment records too keeps
        that entity, and must still have the recorded bytes."""
        path = Path(path)
        if not path.is_file():
            raise CrateError(f"{path}: no such file; the crate describes it (run from the workflow's "
                             "directory, after the rules that write it)")
        entity_id, inside = _file_id(os.path.abspath(path), self.base)
        size, digest = path.stat().st_size, files.sha256_file(path)
        known = self.entities.get(entity_id)
        if known is not None:
            if (known["contentSize"], known["sha256"]) != (str(size), digest):
                raise CrateError(f"{path} changed after a job recorded it (sha256 {known['sha256']}, now "
                                 f"{digest}): rerun the rules that read it (snakemake all)")
            return entity_id
        return self.add_file({"@id": entity_id, "@type": "File", "name": name, "contentSize": str(size),
                              "sha256": digest, **media_type(path.name)}, inside)

    def library(self, name: str, version: str) -> str:
        """A library by its PyPI release (Python by python.org's)."""
        if name == "python":
            return self.add({"@id": f"{PYTHON_URL}downloads/release/python-{version.replace('.', '')}/",
                             "@type": "SoftwareApplication", "name": "Python", "softwareVersion": version,
                             "url": PYTHON_URL})
        return self.add({"@id": _pypi_id(name, version), "@type": "SoftwareApplication", "name": name,
                         "softwareVersion": version, "url": f"{PYPI}{quote(name)}/"})

    def add_recorded_files(self, records: list[tuple[Path, dict]]) -> None:
        """Every file a job read or wrote, once (by its normalised path: `a/../b` is `b`); two
        fragments that disagree on a file's bytes are stale."""
        seen: dict[str, tuple[int, str, Path]] = {}
        for twin, record in records:
            for entry in record["files"]:
                entity_id, inside = _file_id(entry["path"], self.base)
                self.file_ids[entry["path"]] = entity_id
                facts = (entry["bytes"], entry["sha256"])
                if entity_id in seen and seen[entity_id][:2] != facts:
                    size, digest, other = seen[entity_id]
                    raise CrateError(
                        f"{twin} records {entry['path']} with sha256 {facts[1]} ({facts[0]} bytes), {other} "
                        f"with {digest} ({size} bytes): one fragment is stale; run `snakemake verify` and "
                        "rerun the rule it names")
                if entity_id not in seen:
                    seen[entity_id] = (*facts, twin)
                    name = os.path.normpath(entry["path"]) if inside else entry["path"]
                    self.add_file({"@id": entity_id, "@type": "File", "name": Path(name).as_posix(),
                                   "contentSize": str(facts[0]), "sha256": facts[1], **media_type(name)},
                                  inside)

    def add_tool(self, rule: str, runs: list[tuple[Path, dict]]) -> tuple[str, str]:
        """(tool, step) ids of a rule: the command it runs, with the libraries its jobs recorded."""
        tool_id = f"{self.tools_url}#rule-{quote(rule)}" if self.tools_url else local_id("tool", rule)
        step_id = local_id("step", rule)
        requirements = {self.library(n, v) for _, r in runs for n, v in r["libraries"].items()
                        if v != "not installed" and n != OWN_PACKAGE}
        requirements |= {self.library("python", r["machine"]["python"]) for _, r in runs
                         if "python" in r["machine"]}
        tool = {"@id": tool_id, "@type": "SoftwareApplication",
                "name": f"rule {rule} (recipe {_one_or_all(r['recipe'] for _, r in runs)})",
                "description": f"The `encoder-study` command that rule {rule} of the workflow runs.",
                "softwareVersion": _one_or_all(r["version"] for _, r in runs)}
        if self.tools_url:
            tool["url"] = self.tools_url
        if requirements:
            tool["softwareRequirements"] = refs(requirements)
        self.add(tool)
        self.add({"@id": step_id, "@type": "HowToStep", "name": rule, "workExample": ref(tool_id)})
        return tool_id, step_id

    def add_job(self, twin: Path, record: dict, tool_id: str) -> tuple[str, str]:
        """(job, control) ids of one job: its CreateAction, with its fragment's two files, its wall
        time and the ControlAction tying it to its rule's step."""
        rule, name = record["rule"], record_name(record)
        inputs = [self.file_ids[e["path"]] for e in record["files"] if e["role"] == "input"]
        outputs = [self.file_ids[e["path"]] for e in record["files"] if e["role"] == "output"]
        described = [self.add_current(twin, f"Provenance fragment of {name} (JSON)"),
                     self.add_current(provenance.twin(twin), f"Provenance fragment of {name}")]
        environment = self.add_environment(twin, record)
        usage = self.add({"@id": local_id("seconds", name), "@type": "PropertyValue",
                          "propertyID": "wallclock", "name": "wall-clock seconds", "value": record["seconds"],
                          "unitCode": "SEC"})
        job = {"@id": local_id("job", name), "@type": "CreateAction", "name": name,
               "description": f"{record['command']} (code {provenance.describe_code(record['code'])}, "
                              f"encoder-study {record['version']}, {record['threads'] or 'default'} "
                              f"threads, on {record['machine'].get('cpu', 'unknown CPU')})",
               "instrument": ref(tool_id), "agent": ref(self.agent), "startTime": record["started"],
               "endTime": record["finished"], "actionStatus": COMPLETED,
               "subjectOf": refs(described + environment),
               "resourceUsage": ref(usage),
               # A job that writes nothing but its fragment (a check) made that record.
               "result": refs(outputs or described)}
        if inputs:
            job["object"] = refs(inputs)
        job_id = self.add(job)
        control = self.add({"@id": local_id("control", name), "@type": "ControlAction",
                            "name": f"{rule} step of the run: {name}", "agent": ref(self.agent),
                            "instrument": ref(local_id("step", rule)), "object": ref(job_id),
                            "actionStatus": COMPLETED})
        return job_id, control

    def add_environment(self, twin: Path, record: dict) -> list[str]:
        """The complete environment file a fragment names (every installed distribution), as the
        fragment records it; none for a twin written before environment files existed."""
        entry = record.get("environment")
        if not isinstance(entry, dict) or not entry.get("path"):
            return []
        entity_id = self.add_current(self.base / entry["path"], "Complete environment of the jobs that "
                                     "name it: Python and every installed distribution")
        if self.entities[entity_id]["sha256"] != entry.get("sha256"):
            raise CrateError(f"{twin} names the environment file {entry['path']} with sha256 "
                             f"{entry.get('sha256')}, but it is now {self.entities[entity_id]['sha256']}; "
                             "rerun the rule that wrote the fragment")
        return [entity_id]

    def add_snakemake(self, all_records: list[dict]) -> tuple[str, list[str]]:
        """(language, engines) ids: Snakemake as the workflow's language and as the run's engine, in
        each version the fragments record."""
        versions = sorted({r["libraries"].get("snakemake", "not installed") for r in all_records}
                          - {"not installed"})
        if not versions:
            raise CrateError("no fragment records a Snakemake version (libraries.snakemake): the run's "
                             "engine is unknown; rerun the workflow with Snakemake installed")
        language = self.add({"@id": SNAKEMAKE_LANGUAGE, "@type": "ComputerLanguage", "name": "Snakemake",
                             "identifier": ref(SNAKEMAKE_URL), "url": ref(SNAKEMAKE_URL),
                             "version": _one_or_all(versions)})
        return language, [self.library("snakemake", v) for v in versions]


def _add_sources(graph: _Graph, cff: dict, sources: Sources) -> tuple[dict, str]:
    """The workflow's File entity (completed by `build` once the steps are known), the licence's id,
    and every file `sources` names beside them, hashed now."""
    workflow_id, inside = _file_id(os.path.abspath(sources.workflow), graph.base)
    if not inside:
        raise CrateError(f"{sources.workflow}: the workflow must lie inside the crate's root {graph.base} "
                         "(Workflow RO-Crate requires the main workflow file in the crate)")
    graph.add_current(sources.workflow, sources.workflow.name)
    workflow_entity = graph.entities.pop(workflow_id)
    graph.add_current(sources.license, "Licence of the workflow's code")
    graph.add_current(sources.citation, "Citation of the workflow (Citation File Format)")
    readme = graph.add_current(sources.readme, "README of the workflow")
    if readme == "README.md":  # Workflow RO-Crate: the README at the top is about the crate
        graph.entities[readme]["about"] = ref("./")
    for path in sources.code:
        graph.add_current(path, "Workflow code or configuration (hashed when the crate was built)")
    for path in sources.configfiles:
        graph.add_current(path, "Config file the run was given")
    for path in sources.documents:
        kind = "Joined provenance fragments" if path.name == provenance.JOINED_NAME else "Report page"
        graph.add_current(path, f"{kind} (hashed when the crate was built)")
    licence = graph.add({"@id": f"https://spdx.org/licenses/{quote(str(cff['license']))}",
                         "@type": "CreativeWork", "name": f"{cff['license']} licence",
                         "identifier": str(cff["license"])})
    return workflow_entity, licence


def _add_parameter(graph: _Graph, name: str, description: str, examples: set[str]) -> str | None:
    """A FormalParameter of the workflow whose values (files) name it as exampleOfWork."""
    if not examples:
        return None
    param = graph.add({"@id": local_id("param", name), "@type": "FormalParameter", "name": name,
                       "description": description, "additionalType": "File", "workExample": refs(examples)})
    for entity_id in examples:
        graph.entities[entity_id]["exampleOfWork"] = ref(param)
    return param


def _add_run(graph: _Graph, all_records: list[dict], workflow: dict, engines: list[str],
             controls: list[str], configfiles: list[str]) -> None:
    """The run as a CreateAction of the workflow (object: files no job wrote and the config files;
    result: files no job read), its two parameters on the workflow, and Snakemake's OrganizeAction."""
    started = min(r["started"] for r in all_records)
    finished = max(r["finished"] for r in all_records)
    read = {graph.file_ids[e["path"]] for r in all_records for e in r["files"] if e["role"] == "input"}
    written = {graph.file_ids[e["path"]] for r in all_records for e in r["files"] if e["role"] == "output"}
    used, left = (read - written) | set(configfiles), written - read
    run = {"@id": "#run", "@type": "CreateAction", "name": f"Run of {workflow['name']}",
           "description": f"The jobs of {len(all_records)} provenance fragments: every file they read and "
                          "wrote, with its SHA-256.",
           "instrument": ref(workflow["@id"]), "agent": ref(graph.agent), "startTime": started,
           "endTime": finished, "actionStatus": COMPLETED}
    if used:
        run["object"] = refs(used)
    if left:
        run["result"] = refs(left)
    graph.add(run)
    for key, name, description, examples in (
            ("input", "inputs", "Files the run read that no job wrote: sources, configs, architectures.",
             used),
            ("output", "results", "Files the run wrote that no job read: its tables, plots and models.",
             left)):
        param = _add_parameter(graph, name, description, examples)
        if param:
            workflow[key] = ref(param)
    graph.add({"@id": "#organize", "@type": "OrganizeAction", "name": "Snakemake's orchestration of the run",
               "instrument": refs(engines), "result": ref("#run"), "object": refs(controls),
               "agent": ref(graph.agent), "startTime": started, "endTime": finished,
               "actionStatus": COMPLETED})


def _describe_workflow(workflow: dict, cff: dict, all_records: list[dict], graph: _Graph,
                       parts: dict[str, list[str] | str]) -> None:
    """The Snakefile as the workflow: name, version, language, licence, authors, tools and steps; and,
    with a published address of its code, the rest of Bioschemas' ComputationalWorkflow minimum."""
    workflow.update({
        "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"],
        "name": str(cff["title"]), "version": _one_or_all(r["version"] for r in all_records),
        "programmingLanguage": ref(parts["language"]), "license": ref(parts["licence"]),
        "author": refs(parts["authors"]), "creator": refs(parts["authors"]),
        "sdPublisher": ref(graph.agent), "hasPart": refs(parts["tools"]), "step": refs(parts["steps"])})
    if cff.get("date-released"):
        workflow["dateCreated"] = str(cff["date-released"])
    url = code_url(cff)
    if url:
        workflow["url"] = url
        if "dateCreated" in workflow and "input" in workflow and "output" in workflow:
            workflow["conformsTo"] = ref(BIOSCHEMAS_WORKFLOW)


def build(records: list[tuple[Path, dict]], base: str | os.PathLike, sources: Sources,
          agent: str | None = None) -> dict:
    """The crate (JSON-ready) describing the jobs of `records` (`read_fragments`).

    `base` is the crate's root and the folder the recorded paths are relative to (the workflow's
    working directory); `sources` the files described beside the fragments (`Sources`); `agent` who
    ran the workflow (`agent_entity`).
    """
    cff = _citation(Path(sources.citation))
    graph = _Graph(Path(base), code_url(cff))
    graph.agent = graph.add(agent_entity(agent, base))
    authors = [graph.add(a) for a in _authors(cff)]
    graph.add_recorded_files(records)
    workflow, licence = _add_sources(graph, cff, sources)
    by_rule: dict[str, list[tuple[Path, dict]]] = {}
    for twin, record in records:
        by_rule.setdefault(record["rule"], []).append((twin, record))
    tools, steps, jobs, controls = [], [], [], []
    for rule, runs in sorted(by_rule.items()):
        tool_id, step_id = graph.add_tool(rule, runs)
        tools.append(tool_id)
        steps.append(step_id)
        for twin, record in runs:
            job_id, control_id = graph.add_job(twin, record, tool_id)
            jobs.append(job_id)
            controls.append(control_id)

    all_records = [r for _, r in records]
    language, engines = graph.add_snakemake(all_records)
    workflow["name"] = str(cff["title"])
    configfiles = [_file_id(os.path.abspath(p), graph.base)[0] for p in sources.configfiles]
    _add_run(graph, all_records, workflow, engines, controls, configfiles)
    _describe_workflow(workflow, cff, all_records, graph, {"language": language, "licence": licence,
                       "authors": authors, "tools": tools, "steps": steps})
    graph.add_file(workflow, True)
    for profile, name in PROFILES.items():
        graph.add({"@id": profile, "@type": "CreativeWork", "name": name,
                   "version": profile.rsplit("/", 1)[1]})
    if "conformsTo" in workflow:
        graph.add({"@id": BIOSCHEMAS_WORKFLOW, "@type": "CreativeWork",
                   "name": "Bioschemas ComputationalWorkflow profile", "version": "1.0-RELEASE"})

    root = {"@id": "./", "@type": "Dataset", "name": f"{cff['title']}: a run",
            "description": f"Workflow Run RO-Crate of a run of the workflow {workflow['@id']}: "
                           f"{len(by_rule)} rules, {len(all_records)} jobs, "
                           f"{len(set(graph.file_ids.values()))} files. "
                           "Each job's provenance fragment (provenance/) is part of the crate; so are "
                           "the workflow's code and configs, the joined PROVENANCE.md files and the "
                           "report's pages, hashed when the crate was built.",
            "datePublished": max(r["finished"] for r in all_records), "license": ref(licence),
            "author": refs(authors), "publisher": refs(authors), "conformsTo": refs(PROFILES),
            "mainEntity": ref(workflow["@id"]),
            "hasPart": refs(graph.has_part), "mentions": refs([*jobs, "#run"])}
    descriptor = {"@id": CRATE_NAME, "@type": "CreativeWork", "about": ref("./"),
                  "conformsTo": refs([RO_CRATE, WORKFLOW_RO_CRATE])}
    return {"@context": CONTEXT,
            "@graph": [descriptor, root] + [graph.entities[k] for k in sorted(graph.entities)]}


def text(crate: dict) -> str:
    return json.dumps(crate, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write(fragments: Iterable[str | os.PathLike], base: str | os.PathLike, sources: Sources,
          target: str | os.PathLike, agent: str | None = None) -> dict:
    """Read and check the fragments, build the crate, write it atomically; returns the crate."""
    crate = build(read_fragments(fragments), base, sources, agent)
    files.write_text(target, text(crate))
    return crate


def files_of(crate: dict) -> dict[str, dict]:
    """@id -> entity of every File of a crate (what the tests and a reader check hashes against)."""
    def types(e: dict) -> list:
        return e["@type"] if isinstance(e["@type"], list) else [e["@type"]]
    return {e["@id"]: e for e in crate["@graph"] if "File" in types(e)}


# -- the run's digest, and checking files against the crate ------------------------------------------

def digest_line(crate_path: str | os.PathLike) -> tuple[str, str]:
    """(digest, line): the crate's SHA-256 and the line of its digest file, as sha256sum writes it."""
    digest = files.sha256_file(crate_path)
    return digest, f"{digest}  {Path(crate_path).name}\n"


def entity_path(entity: dict, base: str | os.PathLike) -> Path:
    """Where a File entity of the crate lies: its id as a path under `base`, or for a file outside
    the crate (a `#file-` id) the absolute path its name holds."""
    if entity["@id"].startswith("#"):
        return Path(entity["name"])
    return Path(base) / unquote(entity["@id"])


def read(crate_path: str | os.PathLike) -> dict:
    crate = files.read_json(crate_path, "the run crate", "rebuild it: snakemake --cores 1 all",
                            kind=dict, error=CrateError)
    if not isinstance(crate.get("@graph"), list):
        raise CrateError(f"{crate_path}: no @graph; not a run crate (rebuild it: snakemake --cores 1 all)")
    return crate


def check(crate_path: str | os.PathLike, base: str | os.PathLike,
          sha256: Callable[[Path], str] = files.sha256_file) -> list[str]:
    """One line per File of the crate whose bytes are not those the crate records, or that is missing
    (empty: every file matches). `sha256` hashes a file (verify passes one that reads each file once)."""
    problems = []
    for entity_id, entity in sorted(files_of(read(crate_path)).items()):
        path = entity_path(entity, base)
        if not path.is_file():
            problems.append(f"{crate_path}: {entity_id} is missing")
            continue
        actual = sha256(path)
        if actual != entity.get("sha256"):
            problems.append(f"{crate_path}: {entity_id} changed: the crate records sha256 "
                            f"{entity.get('sha256')} ({entity.get('contentSize')} bytes), now {actual} "
                            f"({path.stat().st_size} bytes); if a rule ran again since, `snakemake all` "
                            "rebuilds the crate (and its digest)")
    return problems


def check_digest(crate_path: str | os.PathLike, expected: str) -> list[str]:
    """One line when the crate is missing or its SHA-256 is not the digest `expected` (from a paper;
    hex, optionally written `sha256:<hex>`)."""
    expected = expected.strip().lower().removeprefix("sha256:")
    if not SHA256.match(expected):
        raise CrateError(f"--digest {expected!r}: not a SHA-256 in hex (64 characters 0-9a-f)")
    if not Path(crate_path).is_file():
        return [f"{crate_path} is missing: the digest names a run crate; run `snakemake all` or restore it"]
    actual = files.sha256_file(crate_path)
    if actual != expected:
        return [f"{crate_path}: its SHA-256 is {actual}, not the digest {expected}: this is not the run "
                "the digest names (the crate, and so possibly any file it lists, was changed)"]
    return []


class OnceHasher:
    """`sha256(path)` that reads each file once (by device and inode) however often it is asked,
    through `cache` (a HashCache, `verify --fast`) when given: verify hashes the files the
    fragments name and then those the crate lists, mostly the same files."""

    def __init__(self, cache: HashCache | None = None) -> None:
        self.cache, self.known = cache, {}

    def sha256(self, path: Path) -> str:
        stat = Path(path).stat()
        key = (stat.st_dev, stat.st_ino)
        if key not in self.known:
            self.known[key] = self.cache.sha256(Path(path)) if self.cache else files.sha256_file(path)
        return self.known[key]


# -- who vouches for the run: an SSH signature of the crate ----------------------------------------------

# ssh-keygen's namespace for these signatures, so that one made for something else (a git commit, a
# file) does not pass as a signature of a run.
SIGNATURE_NAMESPACE = "encoder-study-run"


def _ssh_keygen(args: list[str], stdin: bytes, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True, timeout=120)
    except FileNotFoundError as err:
        raise CrateError(f"{what} needs ssh-keygen (OpenSSH 8.1 or later), which is not installed") from err


def sign(crate_path: str | os.PathLike, key: str | os.PathLike, target: str | os.PathLike) -> None:
    """Sign the crate with an SSH key (`ssh-keygen -Y sign`): whoever holds the key vouches for the run
    whose digest the crate's bytes give. The signature goes to `target`."""
    crate_bytes = Path(crate_path).read_bytes()
    done = _ssh_keygen(["-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE], crate_bytes, "signing")
    if done.returncode != 0:
        raise CrateError(f"ssh-keygen could not sign {crate_path} with {key}: "
                         f"{done.stderr.decode(errors='replace').strip()}")
    files.write_text(target, done.stdout.decode("ascii"))


def check_signature(crate_path: str | os.PathLike, signature: str | os.PathLike,
                    allowed_signers: str | os.PathLike, identity: str | None = None) -> tuple[list[str], str]:
    """(problems, who): whether `signature` is a good signature of the crate by a key that
    `allowed_signers` (ssh-keygen's format: `<identity> <key type> <key>` per line) lists for
    `identity` (default: whichever identity it lists for the signing key)."""
    crate_bytes, signature = Path(crate_path).read_bytes(), str(signature)
    if identity is None:
        found = _ssh_keygen(["-Y", "find-principals", "-f", str(allowed_signers), "-s", signature],
                            b"", "checking a signature")
        names = found.stdout.decode(errors="replace").split()
        if found.returncode != 0 or not names:
            return [f"{signature}: made by no key that {allowed_signers} lists"], ""
        identity = names[0]
    done = _ssh_keygen(["-Y", "verify", "-f", str(allowed_signers), "-I", identity, "-n", SIGNATURE_NAMESPACE,
                        "-s", signature], crate_bytes, "checking a signature")
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
        return [f"{signature}: not a good signature of {crate_path} by {identity} "
                f"({said[-1] if said else 'ssh-keygen failed'})"], identity
    return [], identity
