"""The distillation's documents, read where the network is: the project's embedded sample, or the
full study's streamed datasets (FineWeb-2, Wikipedia) at pinned commits, every configuration checked
before any is read; and the staged file (`write_corpus`, `read_corpus`) that `student stage` writes
and `student distill` reads. Apart from the corpus and its batches (`data`), so that a change to the
tokenizer or the batching re-reads no stream.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from ...core import files
from ...data import texts
from . import StudentError

COMMIT_DIGITS = 40  # a Hub repository's commit: a full SHA-1 in hexadecimal


@dataclass(frozen=True)
class Document:
    lang: str
    text: str


def embedded_documents(tatoeba: str | os.PathLike | None, udhr: str | os.PathLike | None) -> list[Document]:
    """The project's multilingual sample: every Tatoeba sentence and every UDHR paragraph, in file order."""
    found: list[Document] = []
    if tatoeba is not None:
        found += [Document(t.lang, t.text) for t in texts.read_tatoeba(tatoeba)]
    if udhr is not None:
        found += [Document(t.lang, t.text) for t in texts.read_udhr(udhr)]
    return found


# The staged corpus: one JSON object a line, {"lang": ..., "text": ...}, in the order read.
CORPUS_FORMAT = "encoder-study student corpus 1"


def write_corpus(documents: Iterable[Document], path: str | os.PathLike) -> int:
    """The documents to `path` (written whole or not at all), first a header line naming the format; how
    many were written. What `student stage` leaves where the network is, for `student distill` to read."""
    count = 0
    with files.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        out.write(json.dumps({"format": CORPUS_FORMAT}) + "\n")
        for document in documents:
            out.write(json.dumps({"lang": document.lang, "text": document.text}, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_corpus(path: str | os.PathLike) -> list[Document]:
    """The documents `write_corpus` wrote; StudentError naming the file, the line and the fix."""
    fix = files.rebuild(path)
    found = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise StudentError(f"{path}, line {number}: not JSON ({err}); {fix}") from err
            if number == 1:
                if row != {"format": CORPUS_FORMAT}:
                    raise StudentError(f"{path}: not a staged corpus (no header {CORPUS_FORMAT!r}); {fix}")
                continue
            if not (isinstance(row, dict) and isinstance(row.get("lang"), str)
                    and isinstance(row.get("text"), str)):
                raise StudentError(f"{path}, line {number}: not a document (lang and text); {fix}")
            found.append(Document(row["lang"], row["text"]))
    if not found:
        raise StudentError(f"{path}: no documents; {fix}")
    return found


@dataclass(frozen=True)
class StreamSource:
    """A Hugging Face dataset read by streaming at one commit of its repository.

    `revision`: the commit (40 hexadecimal digits), or empty: `resolve_revisions` then reads the
    repository's current commit at the run's start, which the run records and prints as the pin to give.
    `configs`: language code -> the dataset's configuration (FineWeb-2 `fra_Latn`, Wikipedia
    `20231101.fr`); at most `max_documents` documents (and `max_chars` characters) per language are
    taken, in the dataset's order.

    `local`: a directory holding one `<config>.jsonl` per configuration, rows in the dataset's format,
    read through the same streaming reader (`datasets`' json builder) without the Hub and without a
    revision; config/rehearsal.yaml's stand-ins, which the workflow writes.
    """

    dataset: str
    revision: str
    configs: Mapping[str, str]
    split: str = "train"
    text_field: str = "text"
    max_documents: int = 1000
    max_chars: int | None = None
    local: str | None = None

    @classmethod
    def from_dict(cls, values: Mapping) -> StreamSource:
        """A source from its config row; a given revision is checked and lowercased, an empty one kept."""
        source = cls(**values)
        if source.max_documents < 1:
            raise StudentError(f"{source.dataset}: max_documents must be positive, "
                               f"got {source.max_documents}")
        if source.local is not None:
            return source
        return replace(source, revision=commit(source.revision, source.dataset) or "")


def commit(revision: str | None, dataset: str) -> str | None:
    """A dataset commit in lowercase, or None when none is given ('' or None).

    Anything else than 40 hexadecimal digits (a branch, a tag, a short hash) is refused: only a commit
    names data that cannot move.
    """
    if not revision:
        return None
    value = revision.strip().lower() if isinstance(revision, str) else ""
    if len(value) != COMMIT_DIGITS or any(c not in "0123456789abcdef" for c in value):
        raise StudentError(f"{dataset}: revision {revision!r} is not a commit ({COMMIT_DIGITS} hexadecimal "
                           "digits); give the dataset repository's commit, or an empty string to read and "
                           "record its current one")
    return value


def resolve_revisions(sources: Sequence[StreamSource], api=None) -> list[StreamSource]:
    """The sources, each Hub source at a commit: a given one as it is, an empty one replaced by the
    dataset repository's current commit (`api.dataset_info(dataset).sha`, one call per dataset; `api`
    default huggingface_hub.HfApi()). Local stand-ins need none and stay as they are."""
    current: dict[str, str] = {}
    resolved = []
    for source in sources:
        if source.local is None and not source.revision:
            if source.dataset not in current:
                current[source.dataset] = _current_commit(source.dataset, api)
            source = replace(source, revision=current[source.dataset])
        resolved.append(source)
    return resolved


def _current_commit(dataset: str, api) -> str:
    if api is None:
        from huggingface_hub import HfApi  # the full study only, as `datasets`

        api = HfApi()
    try:
        sha = api.dataset_info(dataset).sha
    except Exception as err:  # network, authentication, a misspelt name: the Hub's own words say which
        raise StudentError(f"{dataset}: could not read the dataset repository's current commit from the "
                           f"Hub ({err}); give its revision (a commit) in the config") from err
    found = commit(sha, dataset)
    if found is None:
        raise StudentError(f"{dataset}: the Hub named no commit for the dataset repository")
    return found


@dataclass(frozen=True)
class Pinned:
    """A streamed source at the commit it is read at, and whether the config gave that commit (False:
    the repository's current one at this run, to be recorded and given as the pin)."""

    source: StreamSource
    given: bool


def pin_streams(streams: Sequence[Mapping], amounts: Mapping[str, float] | None, world_size: int,
                api=None, config_names=None) -> list[Pinned]:
    """The streamed corpus's sources from their config rows, each Hub dataset at one commit: the
    config's, or (revision empty) the repository's current one (`resolve_revisions`).

    Refused before any download: a language that `amounts` (when given) does not size, an empty
    revision when `world_size` processes read (each would read the current commit on its own), and a
    configuration that its dataset does not have at that commit (`check_configs`, with `config_names`).
    """
    given = [StreamSource.from_dict(s) for s in streams]
    if amounts is not None:
        check_amounts(given, amounts)
    unpinned = [s.dataset for s in given if s.local is None and not s.revision]
    if unpinned and world_size > 1:
        raise StudentError(f"{unpinned}: with several processes every revision must be given (each process "
                           "would read the current commit on its own); run once with student.processes 1, "
                           "or take the commit from huggingface_hub.HfApi().dataset_info(name).sha")
    pinned = [Pinned(source, bool(old.revision))
              for old, source in zip(given, resolve_revisions(given, api), strict=True)]
    check_configs([p.source for p in pinned], config_names)
    return pinned


def _hub_config_names(dataset: str, revision: str) -> list[str]:
    import datasets  # the full study only: the embedded default never installs it

    return datasets.get_dataset_config_names(dataset, revision=revision)


def check_configs(sources: Iterable[StreamSource], config_names=None) -> None:
    """Refuse, before the first document is read, every configuration that its source does not have: a
    local stand-in's `<config>.jsonl`, a Hub dataset's configuration at the source's commit
    (`config_names(dataset, revision)`, one call per dataset; default `datasets.get_dataset_config_names`).
    One error names every missing configuration, so a misspelt name costs seconds, not the documents of
    every configuration sorted before it."""
    config_names = config_names or _hub_config_names
    missing = []
    for source in sources:
        wanted = {lang: source.configs[lang] for lang in sorted(source.configs)}
        if source.local is not None:
            absent = [c for c in wanted.values()
                      if not os.path.isfile(os.path.join(source.local, f"{c}.jsonl"))]
            where = f"{source.local}/<config>.jsonl"
        else:
            try:
                known = set(config_names(source.dataset, source.revision))
            except Exception as err:  # network, authentication, a misspelt dataset: the library's words
                raise StudentError(f"{source.dataset}: could not list its configurations at revision "
                                   f"{source.revision} ({err}); check the name and the network") from err
            absent = [c for c in wanted.values() if c not in known]
            where = f"the configurations of {source.dataset} at {source.revision}"
        missing += [f"{source.dataset} {lang}: {config} (not among {where})"
                    for lang, config in wanted.items() if config in absent]
    if missing:
        raise StudentError(f"{len(missing)} streamed configuration(s) not found, before any document was "
                           "read: " + "; ".join(missing) + "; fix the names in student.corpus.streams")


def check_amounts(sources: Iterable[StreamSource], amounts: Mapping[str, float]) -> None:
    """Refuse, before any download, a language that the sources stream and `amounts` does not size."""
    missing = sorted({lang for source in sources for lang in source.configs} - set(amounts))
    if missing:
        raise StudentError(f"no amount of text given for languages {missing}: add them to "
                           "student.corpus.amounts (the same unit as the others)")


def streamed_documents(sources: Iterable[StreamSource | Mapping], report=None) -> Iterator[Document]:
    """Documents of each source, language by language (sorted codes), through `datasets` streaming;
    `report(line)`, when given, hears of each configuration read (what a long read's log shows).

    `datasets` is imported here and only here: the embedded default never needs it.
    """
    import datasets  # the full study only: the embedded default never installs it

    for source in sources:
        source = source if isinstance(source, StreamSource) else StreamSource.from_dict(source)
        if source.local is None and not source.revision:
            raise StudentError(f"{source.dataset}: no revision to stream at; resolve_revisions gives the "
                               "dataset repository's current commit")
        for lang in sorted(source.configs):
            if source.local is not None:
                path = os.path.join(source.local, f"{source.configs[lang]}.jsonl")
                rows = datasets.load_dataset("json", data_files={source.split: path}, split=source.split,
                                             streaming=True)
            else:
                rows = datasets.load_dataset(source.dataset, source.configs[lang], split=source.split,
                                             streaming=True, revision=source.revision)
            chars = count = 0
            for row in itertools.islice(rows, source.max_documents):
                text = (row.get(source.text_field) or "").strip()
                if not text:
                    continue
                if source.max_chars is not None and chars + len(text) > source.max_chars:
                    break
                chars += len(text)
                count += 1
                yield Document(lang, text)
            if report is not None:
                report(f"{source.dataset} {source.configs[lang]} ({lang}): {count} documents, "
                       f"{chars:,} characters")

