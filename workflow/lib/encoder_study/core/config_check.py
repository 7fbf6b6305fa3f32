"""The config against its schema, one line per mistake: the key's path, what is wrong, and the fix.

jsonschema's own message for an unknown nested key prints the whole schema and config (hundreds of
lines), and a wrong type ends with the bad value alone; this reads the same errors and says each in
one line. The Snakefile runs it before Snakemake's `validate`, which then fills the defaults.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Mapping


def path_of(parts: Iterable) -> str:
    """`tagging.runs[0].lr` from jsonschema's absolute path."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(value), type(value).__name__)


def _expected(kind) -> str:
    kinds = [kind] if isinstance(kind, str) else list(kind)
    return " or ".join({"integer": "an integer", "number": "a number", "string": "a string",
                        "boolean": "true or false", "array": "a list", "object": "a mapping",
                        "null": "null"}.get(k, k) for k in kinds)


# Keys that moved: old path -> new path, so a config written for an earlier version gets the fix.
MOVED = {"tagging.resamples": "tagging.bootstrap.resamples"}


def _unknown(error) -> list[str]:
    known = sorted((error.schema.get("properties") or {}).keys())
    patterns = error.schema.get("patternProperties") or {}
    where = path_of(error.absolute_path)
    lines = []
    for key in sorted(map(str, set(error.instance) - set(known))):
        if any(re.search(pattern, key) for pattern in patterns):
            continue  # a key a pattern allows is not unknown
        moved = MOVED.get(path_of([*error.absolute_path, key]))
        if moved:
            lines.append(f"config: '{path_of([*error.absolute_path, key])}' moved to '{moved}'; "
                         "rename it there")
            continue
        near = difflib.get_close_matches(key, known, 1)
        hint = f" (did you mean '{path_of([*error.absolute_path, near[0]])}'?)" if near else ""
        lines.append(f"config: unknown key '{path_of([*error.absolute_path, key])}'{hint}; the keys of "
                     f"{where or 'the config'} are {', '.join(known)}")
    return lines


def problems(config: Mapping, schema: Mapping) -> list[str]:
    """One line per place where `config` breaks `schema` (sorted by the key's path)."""
    from jsonschema import validators

    validator = validators.validator_for(schema)(schema)
    lines = []
    for error in sorted(validator.iter_errors(config), key=lambda e: path_of(e.absolute_path)):
        where = path_of(error.absolute_path) or "the config"
        if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            lines += _unknown(error) or [f"config: {where}: {error.message}"]
        elif error.validator == "type":
            lines.append(f"config: {where} is {_short(error.instance)} ({_type_name(error.instance)}); "
                         f"give {_expected(error.validator_value)}")
        elif error.validator == "enum":
            lines.append(f"config: {where} is {_short(error.instance)}; give one of "
                         f"{', '.join(map(repr, error.validator_value))}")
        elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            lines.append(f"config: {where} is {_short(error.instance)}; give a value with {error.validator} "
                         f"{error.validator_value}")
        else:
            lines.append(f"config: {where}: {_short(error.message, 200)}")
    return lines


def refuse(*lines: str) -> None:
    """A mistake in the config: its lines (each `config: ...`, naming the key and the fix) on stderr, then
    exit status 1, without Snakemake's traceback frames of the file that found it (the Snakefile's and
    the rule files' config guards call it)."""
    print(*lines, sep="\n", file=sys.stderr, flush=True)
    raise SystemExit(1)
