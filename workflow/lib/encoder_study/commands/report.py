"""`encoder-study report table`: a Markdown table rendered as an HTML page for `snakemake --report`
(library: report_html).

    encoder-study report table results/tagging/scores.md --title "UPOS scores" \\
        --out results/report/tagging/scores.html
"""

from __future__ import annotations

import argparse
from pathlib import Path


def table(args) -> int:
    from .. import files, report_html

    path = Path(args.markdown)
    if not path.is_file():
        from ..errors import UserError

        raise UserError(f"{path}: no such Markdown table; run the rule that writes it first")
    files.write_text(args.out, report_html.render(path.read_text(encoding="utf-8"), args.title, str(path)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="encoder-study report", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="subcommand", required=True)
    t = sub.add_parser("table", help="render a Markdown table as an HTML page")
    t.add_argument("markdown", help="the Markdown table (tables.markdown's output)")
    t.add_argument("--title", required=True, help="heading of the page")
    t.add_argument("--out", required=True, help="the HTML page to write")
    t.set_defaults(run=table)
    return p
