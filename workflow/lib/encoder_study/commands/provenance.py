"""`encoder-study provenance join|verify`: a recipe's PROVENANCE.md, and re-hashing every file named.

    encoder-study provenance join --recipe student --out provenance/student/PROVENANCE.md FRAGMENT...
    encoder-study provenance verify --root provenance --base .
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
    problems = provenance.verify(args.root, args.base)
    if problems:
        print(f"verify: {len(problems)} difference(s):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"verify: every file named by {len(provenance.fragments_under(args.root))} fragment(s) under "
          f"{args.root} matches its SHA-256")
    return 0


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="encoder-study provenance", description="join or verify fragments")
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
    return result
