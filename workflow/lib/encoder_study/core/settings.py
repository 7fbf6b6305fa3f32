"""A group of settings spelled once: a frozen dataclass, from which the command's options are generated
(`add_options`), the rule's flags are rendered from the config (`flags`), the library receives the
object (`from_args`), and the fragment records it under the group's name (`dataclasses.asdict`).

    @dataclass(frozen=True)
    class Bootstrap:
        resamples: int
        ...
        OPTIONS: ClassVar[dict] = {"resamples": "sentence resamples per interval", "method": (help, choices)}

    settings.add_options(parser, Bootstrap, "bootstrap")      # --bootstrap-resamples N, ... all required
    settings.flags(Bootstrap, config["tagging"]["bootstrap"], "bootstrap")   # in a rule's params
    boot = settings.from_args(Bootstrap, args, "bootstrap")

Defaults live in the config schema only, so every generated option is required: a rule passes each one.
The class's `OPTIONS` (a ClassVar) gives each field's help, or (help, choices).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from dataclasses import fields

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _option(prefix: str, name: str) -> str:
    return "--" + (f"{prefix}-" if prefix else "") + name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return (f"{prefix}_" if prefix else "") + name


def add_options(parser, cls, prefix: str = "", defaults=None) -> None:
    """One required option per field of `cls`; `--x`/`--no-x` for a bool. With `defaults` (an instance
    of `cls`: for a command users run by hand, not a rule's), each option takes its value from it."""
    for f in fields(cls):
        kind = _TYPES[f.type if isinstance(f.type, str) else f.type.__name__]
        described = getattr(cls, "OPTIONS", {}).get(f.name)
        help_, choices = described if isinstance(described, tuple) else (described, None)
        extra = {"help": help_, "dest": _dest(prefix, f.name), "required": defaults is None}
        if defaults is not None:
            extra.update(default=getattr(defaults, f.name),
                         help=f"{extra['help']} (default {getattr(defaults, f.name)})")
        if kind is bool:
            parser.add_argument(_option(prefix, f.name), action=argparse.BooleanOptionalAction, **extra)
        else:
            parser.add_argument(_option(prefix, f.name), type=kind, choices=choices, **extra)


def from_args(cls, args: argparse.Namespace, prefix: str = ""):
    """The settings object from parsed options (`add_options`)."""
    return cls(**{f.name: getattr(args, _dest(prefix, f.name)) for f in fields(cls)})


def flags(cls, values: Mapping, prefix: str = "") -> str:
    """The options of `cls`'s fields from `values` (a config group), in field order, every one given."""
    missing = [f.name for f in fields(cls) if f.name not in values]
    if missing:
        raise KeyError(f"settings {cls.__name__}: no value for {', '.join(missing)}")
    out = []
    for f in fields(cls):
        value = values[f.name]
        if isinstance(value, bool):
            out.append(_option(prefix, f.name) if value else "--no-" + _option(prefix, f.name)[2:])
        else:
            out.append(f"{_option(prefix, f.name)} {shlex.quote(str(value))}")
    return " ".join(out)


def recorded(values: dict, cls, prefix: str) -> dict:
    """A fragment's settings with `cls`'s options (`prefix`_field) gathered under the one name `prefix`."""
    names = {_dest(prefix, f.name): f.name for f in fields(cls)}
    out = {k: v for k, v in values.items() if k not in names}
    if any(k in values for k in names):
        out[prefix] = {field: values[dest] for dest, field in names.items() if dest in values}
    return dict(sorted(out.items()))
