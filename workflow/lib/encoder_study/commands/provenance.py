"""`encoder-study provenance join|verify|explain`: a recipe's PROVENANCE.md, re-hashing every file
the fragments' JSON twins name, and the chain of jobs behind a file or one row of a table.

    encoder-study provenance join --recipe student --out provenance/student/PROVENANCE.md FRAGMENT...
    encoder-study provenance verify --root provenance --base . [--env]
    encoder-study provenance explain results/tagging/scores.csv --row minilm-finetuned,test
"""

from __future__ import annotations

import argparse
import sys

from .. import provenance


def join(args) -> int:
    provenance.join(args.recipe, args.fragments, args.out)
    return 0


def verify(args) -> int:
    """Status 1 and one line per difference on stderr when a file changed or is missing."""
    problems = provenance.verify(args.root, args.base, env=args.env)
    if problems:
        print(f"verify: {len(problems)} difference(s):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"verify: every file named by {len(provenance.fragments_under(args.root))} fragment(s) under "
          f"{args.root} matches its SHA-256"
          + ("; the recorded library and Python versions are the installed ones" if args.env else ""))
    return 0


def explain(args) -> int:
    from .. import lineage

    row = args.row.split(",") if args.row is not None else None
    print(lineage.explain(args.root, args.file, row, args.base), end="")
    return 0


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="encoder-study provenance",
                                     description="join, verify or explain fragments")
    sub = result.add_subparsers(required=True)
    p = sub.add_parser("join", help="join a recipe's fragments into its PROVENANCE.md")
    p.set_defaults(run=join)
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", required=True, help="provenance/<recipe>/PROVENANCE.md")
    p.add_argument("fragments", nargs="+")
    p = sub.add_parser("verify", help="re-hash every file the fragments name; status 1 on any difference")
    p.set_defaults(run=verify)
    p.add_argument("--root", required=True, help="the fragments' folder: provenance")
    p.add_argument("--base", required=True, help="the folder the recorded paths are relative to: .")
    p.add_argument("--env", action="store_true",
                   help="also compare the recorded library and Python versions with the installed ones")
    p = sub.add_parser("explain", help="the jobs, commands, code and inputs (with SHA-256) behind a file")
    p.set_defaults(run=explain)
    p.add_argument("file", help="a file the workflow wrote, e.g. results/tagging/scores.csv")
    p.add_argument("--row", help="one row of a CSV table: values of its cells in column order, "
                                 "comma-separated, e.g. minilm-finetuned,test")
    p.add_argument("--root", default="provenance", help="the fragments' folder")
    p.add_argument("--base", default=".", help="the folder the recorded paths are relative to")
    return result
