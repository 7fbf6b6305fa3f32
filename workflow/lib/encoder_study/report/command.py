"""`encoder-study report table|settings|landing`: what `snakemake --report` shows beside the tables and
plots (libraries: report_html, report_facts, report_landing).

    encoder-study report table results/tagging/scores.md --title "UPOS scores" \\
        --out results/report/tagging/scores.html
    encoder-study report settings provenance/*/*.md --rst results/report/settings.rst \\
        --html results/report/run_settings.html
    encoder-study report landing provenance/*/*.md --table scores=results/tagging/scores.md \\
        --digest ro-crate-metadata.sha256 --configfile config/config.yaml --out results/report/landing.rst
"""

from __future__ import annotations

import argparse
from pathlib import Path


def table(args) -> int:
    from ..core import files
    from . import html as report_html

    path = Path(args.markdown)
    if not path.is_file():
        from ..core.errors import UserError

        raise UserError(f"{path}: no such Markdown table; run the rule that writes it first")
    files.write_text(args.out, report_html.render(path.read_text(encoding="utf-8"), args.title, str(path)))
    return 0


def _records(fragments: list[str]) -> list[dict]:
    """The JSON twins of the fragments named (their Markdown or the twins themselves)."""
    from .. import provenance
    from ..provenance.records import read_record

    return [read_record(provenance.twin(f) if f.endswith(".md") else f) for f in fragments]


def settings(args) -> int:
    from ..core import files
    from . import facts as report_facts

    records = _records(args.fragments)
    found = report_facts.facts(records)
    files.write_text(args.rst, report_facts.substitutions(found))
    files.write_text(args.html, report_facts.settings_page(records, found))
    return 0


def landing(args) -> int:
    from ..core import files
    from ..core.errors import UserError
    from . import landing as report_landing

    tables = {}
    for entry in args.table:
        role, _, path = entry.partition("=")
        if not path or not Path(path).is_file():
            raise UserError(f"--table {entry}: expected ROLE=PATH of a Markdown table that exists")
        tables[role] = Path(path).read_text(encoding="utf-8")
    digest = Path(args.digest)
    configs = [(path, files.sha256_file(path)) for path in args.configfile]
    overrides = "" if args.overrides in ("", "{}") else args.overrides
    text = report_landing.page(_records(args.fragments), tables,
                               digest.read_text(encoding="utf-8") if digest.is_file() else None,
                               args.digest, configs, overrides)
    files.write_text(args.out, text)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="encoder-study report", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="subcommand", required=True)
    t = sub.add_parser("table", help="render a Markdown table as an HTML page")
    t.add_argument("markdown", help="the Markdown table (tables.markdown's output)")
    t.add_argument("--title", required=True, help="heading of the page")
    t.add_argument("--out", required=True, help="the HTML page to write")
    t.set_defaults(run=table)
    s = sub.add_parser("settings", help="the facts the captions cite, and every job's settings, from the "
                                        "fragments' JSON twins")
    s.add_argument("fragments", nargs="+", help="the run's fragments (their .md; the twin beside is read)")
    s.add_argument("--rst", required=True, help="the substitution definitions the captions include")
    s.add_argument("--html", required=True, help="the page of recorded settings (a report item)")
    s.set_defaults(run=settings)
    w = sub.add_parser("landing", help="the report's landing page (reStructuredText)")
    w.add_argument("fragments", nargs="+", help="the run's fragments (their .md; the twin beside is read)")
    w.add_argument("--table", action="append", default=[],
                   help="ROLE=PATH of a formatted Markdown table: scores, comparisons, inference, "
                        "trainable, student, retrieval, exports")
    w.add_argument("--digest", required=True, help="the run digest the crate step writes (may be absent)")
    w.add_argument("--configfile", action="append", default=[], help="each config file the run read")
    w.add_argument("--overrides", default="", help="the run's --config values, as JSON")
    w.add_argument("--out", required=True, help="the landing page to write")
    w.set_defaults(run=landing)
    return p
