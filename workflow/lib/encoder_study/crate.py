"""The Workflow Run RO-Crate of a run: `ro-crate-metadata.json`, built from the fragments' JSON twins.

It follows the Provenance Run Crate profile 0.5 (https://w3id.org/ro/wfrun/provenance/0.5, on RO-Crate
1.1; also Workflow Run Crate, Process Run Crate and Workflow RO-Crate 1.0), the version roc-validator
checks:

- the workflow (the Snakefile: File, SoftwareSourceCode, ComputationalWorkflow, HowTo) in Snakemake,
  with the package's version;
- each rule as a step (HowToStep) and a tool (SoftwareApplication, with the libraries its jobs
  recorded as softwareRequirements);
- each job (one fragment) as a CreateAction: its tool as instrument, its inputs as object, its outputs
  as result (File entities with contentSize and sha256), start and end, the command as description,
  its wall time as resourceUsage and its two fragment files (Markdown and JSON twin) as subjectOf; a
  ControlAction ties it to its step;
- the run as a CreateAction of the workflow (object: files no job wrote; result: files no job read),
  and an OrganizeAction with Snakemake (the versions the fragments record) as instrument.

Where the crate sits: at the top of the workflow's working directory (the repository root), beside
results/ and provenance/, not inside either. RO-Crate requires the main workflow file inside the crate
(Workflow RO-Crate; roc-validator checks it) and its 1.1 JSON-LD appendix says an `@id` should not
include `../`; the Snakefile, results/ and provenance/ share only the working directory. Paths the
fragments record are relative to that directory (`base`), so they are the ids as they stand. A file
outside it (an absolute path to a local copy of a data set) gets a local `#` id naming its path: it is
described, with its hash, but not part of the crate's payload (RO-Crate 1.2's rule for such files).

The crate states what the fragments state; `encoder-study provenance verify` re-hashes the files. Its
own job's fragment is not in it (that fragment hashes the crate). Every list is sorted, so the same
fragments give the same bytes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

import yaml

from . import files, provenance
from .errors import UserError

CRATE_NAME = "ro-crate-metadata.json"
CONTEXT = ["https://w3id.org/ro/crate/1.1/context", "https://w3id.org/ro/terms/workflow-run/context"]
RO_CRATE = "https://w3id.org/ro/crate/1.1"
WORKFLOW_RO_CRATE = "https://w3id.org/workflowhub/workflow-ro-crate/1.0"
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
    "https://w3id.org/ro/wfrun/provenance/0.5": "Provenance Run Crate",
    WORKFLOW_RO_CRATE: "Workflow RO-Crate",
}
SNAKEMAKE_LANGUAGE = "https://w3id.org/workflowhub/workflow-ro-crate#snakemake"
SNAKEMAKE_URL = "https://snakemake.readthedocs.io"
# A string, as the Workflow Run Crate examples write it and roc-validator checks it.
COMPLETED = "http://schema.org/CompletedActionStatus"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Media types of the files the workflow writes, by suffix; a fixed table rather than the mimetypes
# module, whose answers depend on the machine's /etc/mime.types (the crate must not).
MEDIA_TYPES = {
    ".csv": "text/csv", ".tsv": "text/tab-separated-values", ".md": "text/markdown", ".html": "text/html",
    ".json": "application/json", ".jsonl": "application/jsonl", ".txt": "text/plain",
    ".conllu": "text/plain", ".xml": "application/xml", ".png": "image/png", ".svg": "image/svg+xml",
    ".onnx": "application/octet-stream", ".safetensors": "application/octet-stream",
    ".pt": "application/octet-stream", ".zip": "application/zip", ".gz": "application/gzip",
}


class CrateError(UserError):
    pass


def media_type(path: str) -> dict:
    """{"encodingFormat": ...} for a known suffix, else {}."""
    found = MEDIA_TYPES.get(Path(path).suffix.lower())
    return {"encodingFormat": found} if found else {}


def ref(entity_id: str) -> dict:
    return {"@id": entity_id}


def refs(ids: Iterable[str]) -> list[dict]:
    return [ref(i) for i in sorted(set(ids))]


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
        record = provenance.read_record(twin)
        check_record(twin, record)
        found.append((twin, record))
    return found


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


def _hashed_file(path: Path, base: Path, name: str) -> tuple[dict, bool]:
    """A file the command was given (a path from the working directory), hashed now."""
    if not path.is_file():
        raise CrateError(f"{path}: no such file; the crate describes it (run from the workflow's "
                         "directory, after the rules that write it)")
    entity_id, inside = _file_id(os.path.abspath(path), base)
    entity = {"@id": entity_id, "@type": "File", "name": name, "contentSize": str(path.stat().st_size),
              "sha256": files.sha256_file(path), **media_type(path.name)}
    return entity, inside


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


def _authors(cff: dict) -> list[dict]:
    entities = []
    for i, author in enumerate(cff["authors"], 1):
        if "name" in author:  # an entity (a group), in CFF's terms
            entity = {"@type": "Organization", "name": author["name"]}
        else:
            names = [str(author[k]) for k in ("given-names", "family-names") if k in author]
            entity = {"@type": "Person", "name": " ".join(names)}
        entity["@id"] = author.get("orcid") or local_id("author", str(i))
        entities.append(entity)
    return entities


def _one_or_all(values: Iterable[str]) -> str:
    """One recorded value, or every distinct one (jobs run with different versions), sorted."""
    return ", ".join(sorted(set(values)))


class _Graph:
    """The crate's entities by @id as they are added, the ids of the files in its payload (hasPart),
    and the @id of each file the fragments record, by its path as recorded."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.entities: dict[str, dict] = {}
        self.has_part: set[str] = set()
        self.file_ids: dict[str, str] = {}
        self.libraries: dict[tuple[str, str], str] = {}

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

    def library(self, name: str, version: str) -> str:
        if (name, version) not in self.libraries:
            self.libraries[(name, version)] = self.add({
                "@id": local_id("software", f"{name}-{version}"), "@type": "SoftwareApplication",
                "name": name, "softwareVersion": version})
        return self.libraries[(name, version)]

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
        tool_id, step_id = local_id("tool", rule), local_id("step", rule)
        requirements = {self.library(n, v) for _, r in runs for n, v in r["libraries"].items()
                        if v != "not installed"}
        requirements |= {self.library("python", r["machine"]["python"]) for _, r in runs
                         if "python" in r["machine"]}
        self.add({
            "@id": tool_id, "@type": "SoftwareApplication",
            "name": f"rule {rule} (recipe {_one_or_all(r['recipe'] for _, r in runs)})",
            "description": f"The `encoder-study` command that rule {rule} of the workflow runs.",
            "softwareVersion": _one_or_all(r["version"] for _, r in runs),
            "softwareRequirements": refs(requirements)})
        self.add({"@id": step_id, "@type": "HowToStep", "name": rule, "workExample": ref(tool_id)})
        return tool_id, step_id

    def add_job(self, twin: Path, record: dict) -> tuple[str, str]:
        """(job, control) ids of one job: its CreateAction, with its fragment's two files, its wall
        time and the ControlAction tying it to its rule's step."""
        rule, name = record["rule"], provenance.record_name(record)
        inputs = [self.file_ids[e["path"]] for e in record["files"] if e["role"] == "input"]
        outputs = [self.file_ids[e["path"]] for e in record["files"] if e["role"] == "output"]
        markdown = provenance.twin(twin)
        described = [
            self.add_file(*_hashed_file(twin, self.base, f"Provenance fragment of {name} (JSON)")),
            self.add_file(*_hashed_file(markdown, self.base, f"Provenance fragment of {name}"))]
        usage = self.add({"@id": local_id("seconds", name), "@type": "PropertyValue",
                          "propertyID": "wallclock", "name": "wall-clock seconds", "value": record["seconds"],
                          "unitCode": "SEC"})
        job = {"@id": local_id("job", name), "@type": "CreateAction", "name": name,
               "description": f"{record['command']} (code {provenance.describe_code(record['code'])}, "
                              f"encoder-study {record['version']}, {record['threads'] or 'default'} "
                              f"threads, on {record['machine'].get('cpu', 'unknown CPU')})",
               "instrument": ref(local_id("tool", rule)), "startTime": record["started"],
               "endTime": record["finished"], "actionStatus": COMPLETED, "subjectOf": refs(described),
               "resourceUsage": [ref(usage)]}
        if inputs:
            job["object"] = refs(inputs)
        if outputs:
            job["result"] = refs(outputs)
        job_id = self.add(job)
        control = self.add({"@id": local_id("control", name), "@type": "ControlAction",
                            "name": f"{rule} step of the run: {name}",
                            "instrument": ref(local_id("step", rule)), "object": ref(job_id),
                            "actionStatus": COMPLETED})
        return job_id, control

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
        engines = [self.add({"@id": local_id("engine", f"snakemake-{v}"), "@type": "SoftwareApplication",
                             "name": "Snakemake", "softwareVersion": v, "url": ref(SNAKEMAKE_URL)})
                   for v in versions]
        return language, engines


def _add_sources(graph: _Graph, cff: dict, workflow: Path, license_file: Path) -> tuple[dict, str]:
    """The workflow's File entity (completed by `build` once the steps are known) and the licence's
    id, with the licence text as a file of the crate."""
    workflow_entity, inside = _hashed_file(workflow, graph.base, workflow.name)
    if not inside:
        raise CrateError(f"{workflow}: the workflow must lie inside the crate's root {graph.base} "
                         "(Workflow RO-Crate requires the main workflow file in the crate)")
    licence_entity, inside = _hashed_file(license_file, graph.base, "Licence of the workflow's code")
    graph.add_file(licence_entity, inside)
    licence = graph.add({"@id": f"https://spdx.org/licenses/{quote(str(cff['license']))}",
                         "@type": "CreativeWork", "name": f"{cff['license']} licence",
                         "identifier": str(cff["license"])})
    return workflow_entity, licence


def _add_run(graph: _Graph, all_records: list[dict], workflow_id: str, title: str, engines: list[str],
             controls: list[str]) -> None:
    """The run as a CreateAction of the workflow (object: files no job wrote; result: files no job
    read) and Snakemake's OrganizeAction of it."""
    started = min(r["started"] for r in all_records)
    finished = max(r["finished"] for r in all_records)
    read = {graph.file_ids[e["path"]] for r in all_records for e in r["files"] if e["role"] == "input"}
    written = {graph.file_ids[e["path"]] for r in all_records for e in r["files"] if e["role"] == "output"}
    run = {"@id": "#run", "@type": "CreateAction", "name": f"Run of {title}",
           "description": f"The jobs of {len(all_records)} provenance fragments: every file they read and "
                          "wrote, with its SHA-256.",
           "instrument": ref(workflow_id), "startTime": started, "endTime": finished,
           "actionStatus": COMPLETED}
    if read - written:
        run["object"] = refs(read - written)
    if written - read:
        run["result"] = refs(written - read)
    graph.add(run)
    graph.add({"@id": "#organize", "@type": "OrganizeAction", "name": "Snakemake's orchestration of the run",
               "instrument": refs(engines), "result": ref("#run"), "object": refs(controls),
               "startTime": started, "endTime": finished, "actionStatus": COMPLETED})


def build(records: list[tuple[Path, dict]], base: str | os.PathLike, workflow: str | os.PathLike,
          citation: str | os.PathLike, license_file: str | os.PathLike) -> dict:
    """The crate (JSON-ready) describing the jobs of `records` (`read_fragments`).

    `base` is the crate's root and the folder the recorded paths are relative to (the workflow's
    working directory); `workflow` the Snakefile, `citation` CITATION.cff (title, authors, licence),
    `license_file` the licence text; the last three are described as files of the crate.
    """
    graph = _Graph(Path(base))
    cff = _citation(Path(citation))
    authors = [graph.add(a) for a in _authors(cff)]
    workflow_entity, licence = _add_sources(graph, cff, Path(workflow), Path(license_file))
    graph.add_recorded_files(records)
    by_rule: dict[str, list[tuple[Path, dict]]] = {}
    for twin, record in records:
        by_rule.setdefault(record["rule"], []).append((twin, record))
    tools, steps, jobs, controls = [], [], [], []
    for rule, runs in sorted(by_rule.items()):
        tool_id, step_id = graph.add_tool(rule, runs)
        tools.append(tool_id)
        steps.append(step_id)
        for twin, record in runs:
            job_id, control_id = graph.add_job(twin, record)
            jobs.append(job_id)
            controls.append(control_id)

    all_records = [r for _, r in records]
    language, engines = graph.add_snakemake(all_records)
    workflow_entity.update({
        "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"],
        "name": str(cff["title"]), "version": _one_or_all(r["version"] for r in all_records),
        "programmingLanguage": ref(language), "license": ref(licence), "author": refs(authors),
        "hasPart": refs(tools), "step": refs(steps)})
    graph.add_file(workflow_entity, True)
    _add_run(graph, all_records, workflow_entity["@id"], cff["title"], engines, controls)
    for profile, name in PROFILES.items():
        graph.add({"@id": profile, "@type": "CreativeWork", "name": name,
                   "version": profile.rsplit("/", 1)[1]})

    root = {"@id": "./", "@type": "Dataset", "name": f"{cff['title']}: a run",
            "description": f"Workflow Run RO-Crate of a run of the workflow {workflow_entity['@id']}: "
                           f"{len(by_rule)} rules, {len(all_records)} jobs, "
                           f"{len(set(graph.file_ids.values()))} files. "
                           "Each job's provenance fragment (provenance/) is part of the crate.",
            "datePublished": max(r["finished"] for r in all_records), "license": ref(licence),
            "author": refs(authors), "publisher": refs(authors), "conformsTo": refs(PROFILES),
            "mainEntity": ref(workflow_entity["@id"]),
            "hasPart": refs(graph.has_part), "mentions": refs([*jobs, "#run"])}
    descriptor = {"@id": CRATE_NAME, "@type": "CreativeWork", "about": ref("./"),
                  "conformsTo": refs([RO_CRATE, WORKFLOW_RO_CRATE])}
    return {"@context": CONTEXT,
            "@graph": [descriptor, root] + [graph.entities[k] for k in sorted(graph.entities)]}


def text(crate: dict) -> str:
    return json.dumps(crate, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write(fragments: Iterable[str | os.PathLike], base: str | os.PathLike, workflow: str | os.PathLike,
          citation: str | os.PathLike, license_file: str | os.PathLike, target: str | os.PathLike) -> dict:
    """Read and check the fragments, build the crate, write it atomically; returns the crate."""
    crate = build(read_fragments(fragments), base, workflow, citation, license_file)
    files.write_text(target, text(crate))
    return crate


def files_of(crate: dict) -> dict[str, dict]:
    """@id -> entity of every File of a crate (what the tests and a reader check hashes against)."""
    def types(e: dict) -> list:
        return e["@type"] if isinstance(e["@type"], list) else [e["@type"]]
    return {e["@id"]: e for e in crate["@graph"] if "File" in types(e)}
