"""`encoder-study <command> <subcommand> [arguments]`: one command per recipe.

The table below is the whole list: recipe `tagging` is command `tagging` is module
`encoder_study.recipes.tagging.command` is rule file `workflow/rules/tagging.smk`. Each command module
has `parser()`, whose subcommands name the function that runs them (`set_defaults(run=...)`);
only the chosen command's module is imported. Errors meant for the user (`errors.UserError`) are
printed as one line with exit status 2, and so is a full disk or a place that cannot be written
(`files.WriteError`, or such an OSError met anywhere), naming the path and the cause; anything else
is a bug and keeps its traceback. SIGTERM (a cluster's time limit, `kill`) ends the command as Ctrl-C
does, through every `finally`, so that temporary files are removed; status 143, as the shell's.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from .core.errors import UserError

# Options that name what a command writes: a write error without a file name names these.
OUTPUT_OPTIONS = ("out", "out_dir", "markdown", "plot", "diffs", "provenance")

COMMANDS = {
    "export": "encoder_study.recipes.export.command",
    "parity": "encoder_study.recipes.parity.command",
    "tagging": "encoder_study.recipes.tagging.command",
    "writeback": "encoder_study.recipes.writeback.command",
    "student": "encoder_study.recipes.student.command",
    "retrieval": "encoder_study.recipes.retrieval.command",
    "provenance": "encoder_study.provenance.command",
    "report": "encoder_study.report.command",
    "benchmarks": "encoder_study.recipes.benchmarks.command",
    "rehearsal": "encoder_study.recipes.rehearsal.command",
    "preflight": "encoder_study.recipes.preflight.command",
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
    name = f"encoder-study {' '.join(argv[:2])}"
    signal.signal(signal.SIGTERM, _terminated)
    try:
        status = args.run(args) or 0
    except UserError as err:
        return _error(name, err)
    except OSError as err:
        return _error(name, _write_fault(err, _outputs(args) if err.filename is None else None))
    except Terminated:
        return _error(name, "terminated (SIGTERM); its temporary files were removed", 128 + signal.SIGTERM)
    try:
        sys.stdout.flush()  # a full disk under a redirected stdout shows here, not at exit
    except OSError as err:
        return _error(name, _write_fault(err, "its standard output"))
    return status


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so that it unwinds like KeyboardInterrupt."""


def _terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def _write_fault(err: OSError, path: str | None):
    """`err` as a WriteError (see files.write_fault); any other OSError is a bug: raised again."""
    from .core.files import write_fault

    fault = write_fault(err, path, writing=False)
    if fault is None:
        raise err
    return fault


def _outputs(args) -> str:
    """The outputs a command was given (for an error that names no file)."""
    named = [str(getattr(args, option)) for option in OUTPUT_OPTIONS if getattr(args, option, None)]
    return "its outputs (" + ", ".join(named) + ")" if named else "its outputs"


def _error(name: str, err, status: int = 2) -> int:
    """The one line of an error; a stderr that cannot take it (a full disk under the log) changes nothing."""
    try:
        print(f"{name}: error: {err}", file=sys.stderr, flush=True)
    except OSError:
        pass
    try:
        sys.stdout.flush()
    except OSError:
        sys.stdout = open(os.devnull, "w")  # else Python reports the failed flush again at exit
    return status


if __name__ == "__main__":
    sys.exit(main())
