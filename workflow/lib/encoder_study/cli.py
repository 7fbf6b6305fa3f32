"""`encoder-study <module> [arguments]`: runs `encoder_study.<module>.main`.

One entry point per rule, found by name, so this file never changes when a command is added and
the rules that list it as an input are not rerun for it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import encoder_study


def commands() -> list[str]:
    found = []
    for info in pkgutil.iter_modules(encoder_study.__path__):
        source = importlib.util.find_spec(f"encoder_study.{info.name}").origin
        with open(source, encoding="utf-8") as handle:
            if "\ndef main(" in handle.read():
                found.append(info.name)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("PYTHONHASHSEED") != "0":
        # transformers iterates over sets of strings while a model is traced (ModernBERT's rotary
        # tables), so an exported graph's node order would follow Python's random hash seed.
        os.execve(sys.executable, [sys.executable, "-m", "encoder_study.cli", *argv],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    names = commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names:
        print("usage: encoder-study <command> [arguments]\ncommands: " + ", ".join(names), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(f"encoder_study.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
