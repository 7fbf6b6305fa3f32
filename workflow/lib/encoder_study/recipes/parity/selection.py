"""The texts the parity tables are computed on: a seeded selection from Tatoeba and the UDHR.

Selection (the same records for every model, so the parity tables compare models on equal texts):

1. Eligible texts are those whose language is in `LANGUAGES` (or in the languages asked for).
   A Tatoeba sentence takes its script from the registry; a UDHR paragraph from its file's
   `iso15924` (so Serbian in Cyrillic and in Latin are two groups), else from the registry.
2. Each text gets a rank: the SHA-256 of (seed, source, text id). Within a (language, script)
   group, texts are taken in rank order. The rank depends on nothing but the seed and the id, so the
   selection is the same whatever the order of the lines or files, and the reader can keep only the
   best-ranked texts of each group while it streams a 13-million-line export.
3. Groups are visited so that scripts alternate: one group of every script, then a second group of
   every script that has one, and so on (which group of a script and which script come first is also
   decided by the seeded hash). Pass 1 takes the best-ranked text of every group in that order,
   pass 2 the second-best, ... until the count is reached. So a selection smaller than the number
   of groups still covers as many scripts as it can, and a larger one as many languages as exist.
4. Each text is stripped of surrounding whitespace and cut to at most `max_chars` Unicode code
   points at a grapheme cluster boundary (`regex`'s `\\X`), so no combining sequence, emoji ZWJ
   sequence, flag or Hangul syllable written in jamo is split. Texts are not normalized: decomposed
   text stays decomposed, and zero-width characters stay, because tokenizers must cope with both.
5. Fewer eligible texts than asked for is an error, not a smaller table.

Output: `parity_texts.jsonl`, one JSON object a line (id, source, lang, script, text, chars,
truncated), sorted by source, language, script and id.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ...core import files
from ...core.files import local_path
from ...core.tables import markdown_table
from ...data.texts import (
    GRAPHEME,
    LANGUAGES,
    SOURCES,
    TATOEBA_NOT_ISO,
    Anomaly,
    SourceStats,
    Text,
    TextError,
    language,
    pinned,
    read_tatoeba,
    read_udhr,
)


def cut(text: str, max_chars: int) -> str:
    """`text` stripped, then at most `max_chars` code points, ending at a grapheme cluster boundary."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    end = 0
    for match in GRAPHEME.finditer(text):
        if match.end() > max_chars:
            break
        end = match.end()
    return text[:end].rstrip()


def source_sha256(path: str | os.PathLike, sha256: str | None, what: str) -> tuple[str, bool]:
    """(SHA-256, pinned?) of a source file or directory, checked against the pin when there is one."""
    path = Path(path)
    expected = pinned(sha256, f"--{what}-sha256")
    if not path.exists():
        raise TextError(f"{what} source {path}: no such file or directory")
    if path.is_dir():  # a directory of UDHR files: the tree hash of files.tree_sha256
        actual = files.tree_sha256(path)
        if expected and actual != expected:
            raise files.IntegrityError(f"{what} source {path} does not match: expected tree SHA-256 "
                                       f"{expected}, actual {actual}; restore the files or fix the pin")
        return actual, bool(expected)
    if expected:
        files.check_file(path, expected, what=f"{what} source")
        return expected, True
    return files.sha256_file(path), False


def rank(seed: int, *parts: str) -> int:
    """A number fixed by the seed and the parts; orders texts, languages and scripts."""
    data = "\x1f".join([str(seed), *parts]).encode("utf-8")
    return int.from_bytes(hashlib.sha256(data).digest()[:16], "big")


class Pool:
    """The `count` best-ranked eligible texts of every (language, script) group of one source."""

    def __init__(self, source: str, count: int, seed: int, languages: set[str]):
        self.source, self.count, self.seed, self.languages = source, count, seed, languages
        self.heaps: dict[tuple[str, str], list[tuple[int, str, Text]]] = defaultdict(list)
        self.available: Counter[tuple[str, str]] = Counter()
        self.ineligible: Counter[str] = Counter()

    def offer(self, text: Text) -> None:
        if text.lang not in self.languages or text.script is None:
            self.ineligible[text.lang] += 1
            return
        group = (text.lang, text.script)
        self.available[group] += 1
        heap = self.heaps[group]
        item = (-rank(self.seed, self.source, text.id), text.id, text)  # max-heap of the kept ranks
        if len(heap) < self.count:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)

    def group_order(self) -> list[tuple[str, str]]:
        """Groups with scripts alternating: the first group of each script, then the second, ..."""
        by_script: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for group in self.heaps:
            by_script[group[1]].append(group)
        scripts = sorted(by_script, key=lambda s: rank(self.seed, self.source, "script", s))
        for s in scripts:
            by_script[s].sort(key=lambda g: rank(self.seed, self.source, "language", g[0], g[1]))
        depth = max((len(v) for v in by_script.values()), default=0)
        return [by_script[s][i] for i in range(depth) for s in scripts if i < len(by_script[s])]

    def select(self) -> list[Text]:
        ranked = {g: [t for _, _, t in sorted(h, key=lambda item: (-item[0], item[1]))]
                  for g, h in self.heaps.items()}
        order = self.group_order()
        chosen: list[Text] = []
        for depth in range(self.count):
            for group in order:
                if len(chosen) == self.count:
                    return chosen
                if depth < len(ranked[group]):
                    chosen.append(ranked[group][depth])
        return chosen


def natural_key(text_id: str) -> tuple:
    """Sort key that puts `tatoeba:9` before `tatoeba:10` and `article-2` before `article-10`."""
    parts = re.split(r"(\d+)", text_id)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def output_record(text: Text, max_chars: int) -> dict:
    short = cut(text.text, max_chars)
    if not short:
        raise TextError(f"{text.where}: its first grapheme cluster is longer than {max_chars} code points, "
                        "so no cut keeps it whole; raise --max-chars")
    return {"id": text.id, "source": text.source, "lang": text.lang, "script": text.script, "text": short,
            "chars": len(short), "truncated": short != text.text.strip()}


@dataclass
class Selection:
    records: list[dict]
    stats: dict[str, SourceStats]
    pools: dict[str, Pool]


def select_texts(sources: dict[str, Iterable[Text]], counts: dict[str, int], seed: int, max_chars: int,
                 languages: Iterable[str] | None = None, stats: dict[str, SourceStats] | None = None
                 ) -> Selection:
    """Pick `counts[source]` texts from each source by the rule of the module docstring."""
    if languages is None:
        allowed = set(LANGUAGES)
    else:
        allowed = set()
        for code in languages:
            language(code)
            allowed.add(code)
    if max_chars < 1:
        raise TextError(f"--max-chars {max_chars}: must be at least 1")
    pools: dict[str, Pool] = {}
    for source, texts in sources.items():
        count = counts.get(source, 0)
        if count < 0:
            raise TextError(f"--{source}-count {count}: must not be negative")
        pool = pools[source] = Pool(source, count, seed, allowed)
        if count == 0:
            continue
        for text in texts:
            pool.offer(text)
        eligible = sum(pool.available.values())
        if eligible < count:
            raise TextError(f"{source}: asked for {count} texts but only {eligible} are eligible (in "
                            f"{len(pool.available)} language/script groups of the languages asked for); "
                            f"lower --{source}-count to at most {eligible}, or add texts or languages")
    chosen = [t for pool in pools.values() for t in pool.select()]
    if not chosen:
        raise TextError("the selection is empty: every count is 0 or no source was given; ask for at least "
                        "one Tatoeba sentence or UDHR paragraph")
    if languages is not None:
        present = {group[0] for pool in pools.values() for group in pool.available}
        missing = sorted(allowed - present)
        if missing:
            raise TextError(f"--languages asks for {', '.join(missing)}, but no source has an eligible text "
                            "in them; drop them from --languages or give sources that have them")
    chosen.sort(key=lambda t: (SOURCES.index(t.source) if t.source in SOURCES else len(SOURCES), t.source,
                               t.lang, t.script or "", natural_key(t.id)))
    return Selection([output_record(t, max_chars) for t in chosen], stats or {}, pools)


@dataclass
class Chosen:
    """A selection with what made it: the source files read, notes for a reader of the fragment, and
    every anomaly the readers met (in source order, then file name, then document order)."""

    selection: Selection
    inputs: list[Path]
    notes: list[str]
    anomalies: list[Anomaly] = field(default_factory=list)


def choose(given: dict[str, str | None], sha256s: dict[str, str], counts: dict[str, int], seed: int,
           max_chars: int, languages: list[str] | None) -> Chosen:
    """Read each source of SOURCES that `counts` asks texts of (`given`: a path or file:// URL; its pin
    in `sha256s`, '' for none) and select the texts by the rule of the module docstring."""
    sources: dict[str, Iterable[Text]] = {}
    stats = {s: SourceStats() for s in SOURCES}
    hashes: dict[str, tuple[str, bool]] = {}
    inputs = []
    for source, reader in (("tatoeba", read_tatoeba), ("udhr", read_udhr)):
        count = counts[source]
        if count == 0:
            continue
        if not given.get(source):
            raise TextError(f"--{source} is required when --{source}-count is {count}")
        path = local_path(given[source])
        if path is None:
            raise TextError(f"--{source} {given[source]}: a network URL; fetch it first with `encoder-study "
                            "parity fetch` and give the local file")
        hashes[source] = source_sha256(path, sha256s[source], source)
        inputs.append(path)
        sources[source] = reader(path, stats[source])
    selection = select_texts(sources, counts, seed, max_chars, languages, stats)
    records = selection.records
    notes = [f"{len(records)} texts in {len({r['lang'] for r in records})} languages and "
             f"{len({r['script'] for r in records})} scripts, chosen with seed {seed}; "
             f"{sum(r['truncated'] for r in records)} cut at {max_chars} code points on a grapheme boundary"]
    for source, (digest, was_pinned) in hashes.items():
        state = "pinned and checked" if was_pinned else (
            "recorded, not pinned: put it in the config to make the next run check it")
        notes.append(f"{source} source SHA-256 {digest} ({state})")
    for source, pool in selection.pools.items():
        st = stats[source]
        if source not in sources:
            notes.append(f"{source}: not read (count 0)")
            continue
        skipped = sum(pool.ineligible.values())
        top = ", ".join(f"{c} ({n})" for c, n in sorted(pool.ineligible.items(),
                                                         key=lambda kv: (-kv[1], kv[0]))[:12])
        if source == "tatoeba":
            # Stated even when 0, so a reader sees that unknown languages were looked for.
            odd = (f"; {st.no_language} without a language (\\N), skipped"
                   + (f"; {st.empty_language} with an empty language field, skipped" if st.empty_language
                      else "")
                   + (f"; {st.not_iso} with a non-ISO code ({', '.join(sorted(TATOEBA_NOT_ISO))}), skipped"
                      if st.not_iso else ""))
        else:
            odd = f"; {st.skipped_files} file(s) skipped; {st.empty} empty paragraphs skipped"
        eligible = sum(pool.available.values())
        notes.append(f"{source}: {st.records} records in {st.files} file(s){odd}; {eligible} eligible in "
                     f"{len(pool.available)} language/script groups; {skipped} in languages not asked for or "
                     f"not in the registry{': ' + top if top else ''}")
    anomalies = [a for source in SOURCES for a in stats[source].anomalies]
    notes.append(f"{len(anomalies)} source anomalies, each with what was done: see the table Source "
                 "anomalies")
    notes.append("rule: within each language/script group, texts in order of SHA-256(seed, source, id); "
                 "groups visited with scripts alternating; UDHR paragraphs keyed by their place in the "
                 "document; see encoder_study.data.texts")
    return Chosen(selection, inputs, notes, anomalies)


def anomalies_table(anomalies: list[Anomaly]) -> str:
    """The anomalies the readers met: source, file, what was odd, what was done (one row if none)."""
    rows = [(a.source, a.file, a.what, a.done) for a in anomalies] or [("-", "-", "none found", "-")]
    return markdown_table(["source", "file", "what was odd", "what was done"], rows, "llll")


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records]
    files.write_text(path, "".join(lines))


def counts_table(records: list[dict]) -> str:
    """Texts per language and script, per source, with how many were cut."""
    rows: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in records:
        row = rows[(r["lang"], r["script"])]
        row[r["source"]] += 1
        row["truncated"] += int(r["truncated"])
    body = [(lang, LANGUAGES.get(lang, ("?", ""))[0], script, c["tatoeba"], c["udhr"],
             c["tatoeba"] + c["udhr"], c["truncated"]) for (lang, script), c in sorted(rows.items())]
    return markdown_table(["lang", "name", "script", "tatoeba", "udhr", "total", "cut"], body,
                                     "lllrrrr")


def scripts_table(records: list[dict]) -> str:
    per: dict[str, Counter] = defaultdict(Counter)
    langs: dict[str, set] = defaultdict(set)
    for r in records:
        per[r["script"]][r["source"]] += 1
        langs[r["script"]].add(r["lang"])
    body = [(s, len(langs[s]), c["tatoeba"], c["udhr"], c["tatoeba"] + c["udhr"])
            for s, c in sorted(per.items())]
    return markdown_table(["script", "languages", "tatoeba", "udhr", "total"], body, "lrrrr")

