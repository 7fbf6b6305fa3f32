"""The report's landing page (reStructuredText, shown by `snakemake --report` as the workflow's description):
the study in three sentences, the headline tables inline, and what identifies the run (its digest, the code's
commit, the config files).

Everything comes from what ran: the fragments' JSON twins (report_facts), the formatted Markdown tables
(the same digits as the .md files and the report's table pages), the digest the crate step wrote and the
config files the run read. Nothing is recomputed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from ..core.errors import UserError
from ..core.results import LANDING, RESULTS
from ..recipes.tagging.evaluate import split_order
from . import facts as report_facts
from .html import join_intervals, parse_markdown_table

HEX64 = re.compile(r"\b[0-9a-f]{64}\b")
# The headline tables (encoder_study.core.results): (role, title, the columns shown).
PARITY_TABLES = tuple((role, RESULTS[LANDING[role]].landing_title, RESULTS[LANDING[role]].landing)
                      for role in ("inference", "trainable", "student"))
EXPORTS = RESULTS[LANDING["exports"]]
RETRIEVAL = RESULTS[LANDING["retrieval"]]


class LandingError(UserError):
    """A table the landing page shows lacks a column it reads."""


def table(markdown: str, source: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a formatted Markdown table, each interval joined to its value."""
    header, _align, rows = join_intervals(*parse_markdown_table(markdown, source))
    return header, rows


def pick(header: Sequence[str], rows: Sequence[Sequence[str]], wanted: Sequence[str], source: str):
    missing = [name for name in wanted if name not in header]
    if missing:
        raise LandingError(f"{source}: no column {', '.join(missing)} (columns: {', '.join(header)}); the "
                           "landing page and the table's writer disagree")
    at = [list(header).index(name) for name in wanted]
    return list(wanted), [[row[i] for i in at] for row in rows]


def by_split(header, rows, keys: Sequence[str], value: str, source: str):
    """Rows pivoted: one per key (the `keys` cells joined by " - ", in first-seen order), one column per
    split (test first, dev last), each cell the `value` column."""
    _, picked = pick(header, rows, (*keys, "split", value), source)
    n = len(keys)
    splits = split_order(row[n] for row in picked)
    cells: dict[str, dict[str, str]] = {}
    for row in picked:
        cells.setdefault(" - ".join(row[:n]), {})[row[n]] = row[n + 1]
    return [" - ".join(keys), *splits], [[name, *(cells[name].get(s, "–") for s in splits)] for name in cells]


def list_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An rST list-table (every cell escaped: the report shows the digits as they are)."""
    lines = [f".. list-table:: {report_facts.rst_text(title)}", "   :header-rows: 1", ""]
    for row in [header, *rows]:
        for i, cell in enumerate(row):
            lines.append(f"   {'*' if i == 0 else ' '} - {report_facts.rst_text(cell)}")
    return "\n".join(lines) + "\n"


def literal(lines: Sequence[Sequence[str]]) -> str:
    """Columns aligned in a literal block (the report scrolls it sideways rather than wrap a hash)."""
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    body = ["   " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in lines]
    return "::\n\n" + "\n".join(body) + "\n"


def heading(text: str, underline: str) -> str:
    return f"{text}\n{underline * len(text)}\n"


# -- the three sentences --------------------------------------------------------------------------------

def what_ran(run: report_facts.Run, texts: int | None) -> str:
    """Sentence one: what the run did, from the recipes whose jobs it recorded."""
    parts = []
    encoders = [r["settings"].get("model", r.get("wildcards")) for r in run.all("export_acquire")]
    if encoders:
        parts.append(f"exports {report_facts.join_words(encoders)} to ONNX")
    if run.all("parity_compare"):
        on = f" on {texts:,} texts" if texts else ""
        parts.append(f"checks each export against PyTorch token by token{on}")
    distill = run.one("student_distill")
    if distill is not None:
        teacher = PurePosixPath(str(distill["settings"].get("teacher_dir", "?"))).name
        parts.append(f"distils a {report_facts.student_name(run)} from {teacher}")
    modes = [s.get("mode") for s in run.settings("tagging_train")] + ["spaCy"] * len(run.all("tagging_spacy"))
    if modes:
        words = {"finetuned": "fine-tuned"}
        kinds = ", ".join(f"{modes.count(m)} {words.get(m, m)}" for m in sorted(set(modes), key=str))
        parts.append(f"tags UPOS with {len(modes)} runs ({kinds}) and a most-frequent-tag baseline, each "
                     "score with a sentence-level bootstrap interval")
    if run.all("writeback_pipeline"):
        parts.append("writes the fine-tuned weights back into ONNX graphs")
    if run.all("retrieval_export"):
        parts.append("exports a three-head retrieval graph")
    return f"This run of the encoder study {report_facts.join_words(parts)}." if parts else \
        "This run recorded no job of the study."


def on_what(found: Mapping[str, str]) -> str:
    """Sentence two: its data and models, the random ones said to be random."""
    return f"It ran on {found['treebank']}, and its models are: {found['models']}."


def headline(run: report_facts.Run, comparisons: str | None, found: Mapping[str, str]) -> str:
    """Sentence three: the first configured comparison on the test split (or the first split it has)."""
    tables = run.one("tagging_tables")
    pairs = report_facts.parsed(tables["settings"].get("compare", [])) if tables else []
    if not pairs:
        return "The run compared no tagging runs, so it has no headline difference; its tables follow."
    if not comparisons:
        return "The comparisons table was not given, so this page has no headline difference."
    header, rows = table(comparisons, "comparisons")
    ci = next((h for h in header if h.startswith("a - b [")), None)
    _, picked = pick(header, rows, ("a", "b", "split", ci or "a - b [95% CI]"), "comparisons")
    a, b = pairs[0]
    mine = {split: cell for ra, rb, split, cell in picked if (ra, rb) == (a, b)}
    if not mine:
        return f"The first configured comparison, {a} - {b}, has no row in the comparisons table."
    split = split_order(mine)[0]
    level = ci[len("a - b ["):-1] if ci else "95% CI"
    caveat = (", on a synthetic treebank that makes no claim about English"
              if found["treebank"].startswith("the synthetic") else "")
    return (f"The first configured comparison, {a} minus {b} on {split}, is {mine[split]} points of UPOS "
            f"accuracy ({level}, paired bootstrap over sentences, {found['bootstrap']}){caveat}.")


def texts_count(run: report_facts.Run) -> int | None:
    """How many texts the selection kept, as its fragment's note says ("200 texts in 52 languages ...")."""
    select = run.one("parity_select")
    for note in select.get("notes", []) if select else []:
        found = re.match(r"([\d,]+) texts\b", note)
        if found:
            return int(found[1].replace(",", ""))
    return None


# -- the page -----------------------------------------------------------------------------------------

def tagging_tables(tables: Mapping[str, str]) -> list[str]:
    parts = []
    for role, keys, prefix, title in (("scores", ("run",), "UPOS", "{} by run and split"),
                                      ("comparisons", ("a", "b"), "a - b", "Paired differences, {}, points")):
        if role in tables:
            header, rows = table(tables[role], role)
            value = next((h for h in header if h.startswith(prefix)), prefix)
            parts.append(list_table(title.format(value), *by_split(header, rows, keys, value, role)))
    return parts


def parity_tables(tables: Mapping[str, str]) -> list[str]:
    parts = []
    for role, title, columns in PARITY_TABLES:
        if role in tables:
            parts.append(list_table(title, *pick(*table(tables[role], role), columns, role)))
    if "retrieval" in tables:
        _, rows = pick(*table(tables["retrieval"], "retrieval"), RETRIEVAL.landing, "retrieval")
        close = sum(row[1] == "yes" for row in rows)
        largest = max(rows, key=lambda row: float(row[0]))[0] if rows else "–"
        parts.append(report_facts.rst_text(
            f"The retrieval graph against its PyTorch reference: {close} of {len(rows)} outputs allclose at "
            f"tolerance {agreed_cell(rows, 2)}, the largest max abs {largest}.") + "\n")
    return parts


def agreed_cell(rows: Sequence[Sequence[str]], column: int) -> str:
    return " / ".join(sorted({row[column] for row in rows})) or "–"


def exports_block(markdown: str) -> str:
    header, rows = pick(*table(markdown, "exports"), EXPORTS.landing, "exports")
    return literal([header, *rows])


def run_block(found: Mapping[str, str], digest: str | None, digest_path: str,
              configs: Sequence[tuple[str, str]], overrides: str) -> str:
    lines = [["run digest", digest or f"none: no digest at {digest_path}"],
             ["", f"(SHA-256 of the run crate, written beside it to {digest_path})"],
             ["commit", found["commit"]]]
    for i, (path, sha) in enumerate(configs):
        lines.append(["config file" if i == 0 else "", f"{path}  sha256 {sha}"])
    lines.append(["--config", overrides or "none"])
    return literal(lines)


def page(records: Sequence[Mapping], tables: Mapping[str, str], digest: str | None, digest_path: str,
         configs: Sequence[tuple[str, str]], overrides: str = "") -> str:
    """The landing page. `tables`: role (scores, comparisons, inference, trainable, student, retrieval,
    exports) -> formatted Markdown; `digest`: the run digest's text (None when the crate step wrote
    none); `configs`: (path, SHA-256) of each config file, in the order they apply."""
    run = report_facts.Run(records)
    found = report_facts.facts(records)
    digest_hex = HEX64.search(digest or "")
    parts = [heading("The encoder study: this run", "="),
             " ".join(report_facts.rst_text(s) for s in (
                 what_ran(run, texts_count(run)), on_what(found),
                 headline(run, tables.get("comparisons"), found))) + "\n"]
    tagging = tagging_tables(tables)
    if tagging:
        parts += [heading("Tagging", "-"), *tagging]
    parity = parity_tables(tables)
    if parity:
        parts += [heading("Parity", "-"), *parity]
    if "exports" in tables:
        parts += [heading(EXPORTS.landing_title, "-"), exports_block(tables["exports"])]
    parts += [heading("The run", "-"),
              run_block(found, digest_hex[0] if digest_hex else None, digest_path, configs, overrides)]
    if digest_hex:
        parts.append(f"Check it: ``encoder-study provenance verify --root provenance --base . --digest "
                     f"{digest_hex[0]}`` checks the crate against this digest, then every file against the "
                     "crate.\n")
    parts.append("Every table and plot, with a caption saying how it was computed, is under the menu's "
                 "categories; the settings each caption cites are the run's own, listed in "
                 "`run_settings.html`_.\n")
    return "\n".join(parts)
