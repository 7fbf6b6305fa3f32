"""`encoder-study <command> <subcommand> [arguments]`: one command per recipe.

The table below is the whole list: recipe `tagging` is command `tagging` is module
`encoder_study.commands.tagging` is rule file `workflow/rules/tagging.smk`. Each command module
has `parser()`, whose subcommands name the function that runs them (`set_defaults(run=...)`);
only the chosen command's module is imported. Errors meant for the user (`errors.UserError`) are
printed as one line with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

from .errors import UserError

COMMANDS = {
    "export": "encoder_study.commands.export",
    "parity": "encoder_study.commands.parity",
    "tagging": "encoder_study.commands.tagging",
    "writeback": "encoder_study.commands.writeback",
    "student": "encoder_study.commands.student",
    "retrieval": "encoder_study.commands.retrieval",
    "provenance": "encoder_study.commands.provenance",
    "report": "encoder_study.commands.report",
    "benchmarks": "encoder_study.commands.benchmarks",
    "rehearsal": "encoder_study.commands.rehearsal",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("PYTHONHASHSEED") != "0":
        # transformers iterates over sets of strings while a model is traced (ModernBERT's rotary
        # tables), so an exported graph's node order would follow Python's random hash seed.
        os.execve(sys.executable, [sys.executable, "-m", "encoder_study.cli", *argv],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    if not argv or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: encoder-study <command> <subcommand> [arguments]\ncommands: " + ", ".join(COMMANDS),
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    args = importlib.import_module(COMMANDS[argv[0]]).parser().parse_args(argv[1:])
    try:
        return args.run(args) or 0
    except UserError as err:
        print(f"encoder-study {' '.join(argv[:2])}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
