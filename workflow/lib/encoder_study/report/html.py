"""HTML renderings of the study's Markdown tables, for `snakemake --report` (which offers a CSV only as a
download). The Markdown tables are the formatted ones (tables.markdown); this module only changes their
markup, so the report shows the same digits as the .md files. An interval column ("95% CI", cells such as
"[96.79, 97.35]") is joined to the column before it: "97.07 [96.79, 97.35]". Standard library only.
"""

from __future__ import annotations

import html
import re

from ..core.errors import UserError

CI_TITLE = re.compile(r"^\d+% CI$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
# A cell holding a long word (a SHA-256, a path: LONG_WORD) may break it, so that the table fits the
# report's frame rather than have its last columns cut; no other word breaks, and numbers and intervals
# stay on one line.
LONG_WORD = re.compile(r"\S{24,}")
STYLE = ("table{border-collapse:collapse;font:14px sans-serif}"
         "th,td{padding:3px 9px;border-bottom:1px solid #ddd}th{background:#f3f3f3}"
         "td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}td.r{white-space:nowrap}"
         "td.w{overflow-wrap:anywhere}")


def _cells(line: str) -> list[str]:
    inner = line.strip()
    if not (inner.startswith("|") and inner.endswith("|")):
        raise ValueError(line)
    return [c.strip().replace("\\|", "|") for c in _CELL_SPLIT.split(inner[1:-1])]


def _first_table(lines: list[str]) -> tuple[int, int]:
    """[start, end) of the first run of lines that start with '|'."""
    is_row = [ln.strip().startswith("|") for ln in lines]
    start = is_row.index(True) if True in is_row else len(lines)
    end = is_row.index(False, start) if False in is_row[start:] else len(lines)
    return start, end


def parse_markdown_table(text: str, source: str = "<text>") -> tuple[list[str], str, list[list[str]]]:
    """(header, alignment 'l'/'r' per column, rows) of the first GitHub Markdown table in `text`."""
    all_lines = text.splitlines()
    start, end = _first_table(all_lines)
    lines = all_lines[start:end]  # the first table only: text after it is notes (see `notes`)
    try:
        header, rule = _cells(lines[0]), _cells(lines[1])
        rows = [_cells(ln) for ln in lines[2:]]
    except (IndexError, ValueError):
        raise UserError(f"{source}: no Markdown table (a '| a | b |' header, a '| --- | ---: |' rule, rows); "
                        "rebuild it with the rule that writes it") from None
    if len(rule) != len(header) or not all(set(r) <= set("-:") and "-" in r for r in rule):
        raise UserError(f"{source}: line 2 is not a Markdown table rule for {len(header)} columns")
    for number, row in enumerate(rows, start=3):
        if len(row) != len(header):
            raise UserError(f"{source}: line {number} has {len(row)} cells, the header {len(header)}")
    return header, "".join("r" if r.endswith(":") else "l" for r in rule), rows


def notes(text: str) -> list[str]:
    """The non-empty lines outside the first table (e.g. the treebank caption under a score table)."""
    all_lines = text.splitlines()
    start, end = _first_table(all_lines)
    return [ln.strip() for ln in all_lines[:start] + all_lines[end:] if ln.strip()]


def join_intervals(header, align, rows):
    """Each 'NN% CI' column joined to the column before it, as 'value [low, high]'."""
    keep = [i for i, title in enumerate(header) if not (i > 0 and CI_TITLE.match(title))]
    joined = {i - 1 for i, title in enumerate(header) if i > 0 and CI_TITLE.match(title)}
    new_header = [f"{header[i]} [{header[i + 1]}]" if i in joined else header[i] for i in keep]
    new_rows = [[f"{row[i]} {row[i + 1]}" if i in joined else row[i] for i in keep] for row in rows]
    return new_header, "".join(align[i] for i in keep), new_rows


def html_table(header, align, rows) -> str:
    def line(tag, cells):
        cells = zip(align, cells, strict=True)
        return "<tr>" + "".join(f'<{tag} class="{a}{" w" * bool(LONG_WORD.search(c))}">'
                                f"{html.escape(c)}</{tag}>" for a, c in cells) + "</tr>"

    body = "\n".join(line("td", row) for row in rows)
    return f"<table>\n<thead>{line('th', header)}</thead>\n<tbody>\n{body}\n</tbody>\n</table>\n"


def render(markdown: str, title: str, source: str = "<text>") -> str:
    """A standalone HTML page showing the Markdown table `markdown` (intervals joined to their values)."""
    table = html_table(*join_intervals(*parse_markdown_table(markdown, source)))
    table += "".join(f"<p>{html.escape(line)}</p>\n" for line in notes(markdown))
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n<h3>{html.escape(title)}</h3>\n{table}</body></html>\n")
