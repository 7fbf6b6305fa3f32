"""config/README.md from the config schema: every key, its type, default and description.

    python -m encoder_study.core.config_doc workflow/schemas/config.schema.yaml > config/README.md

A key's path is dotted; `[]` is an item of a list and `<name>` any key of a mapping (`threads.<rule>`).
Keys that exist only for one kind of entry (a Hub model's `repo`) name the condition. The test
tests/test_config_doc.py checks that the README names exactly the schema's paths.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

INTRO = """# The workflow's configuration

`config/config.yaml` is the embedded default (offline, 2 cores, minutes); `config/paper.yaml` is the full
study. Snakemake validates the config against `workflow/schemas/config.schema.yaml`, which also holds
every default: a key left out takes the default below. A path's `[]` is an item of a list and `<name>` any
key of a mapping (`threads.<rule>`: a rule's name).

This page is generated from the schema (`python -m encoder_study.core.config_doc
workflow/schemas/config.schema.yaml > config/README.md`); tests/test_config_doc.py fails when a key is
in one and not the other.

| key | type | default | description |
| --- | --- | --- | --- |
"""


@dataclass
class Key:
    path: str
    types: list[str] = field(default_factory=list)
    default: str = ""
    descriptions: list[tuple[str | None, str]] = field(default_factory=list)  # (condition, text)
    conditions: list[str] = field(default_factory=list)
    always: bool = False  # also outside any condition

    def description(self) -> str:
        texts = list(dict.fromkeys(text for _, text in self.descriptions))
        if len(texts) <= 1:
            text = texts[0] if texts else ""
        else:  # differs by kind of entry: say each
            text = "; ".join(f"with {c}: {t.rstrip('.')}" if c else t.rstrip(".")
                             for c, t in self.descriptions)
        if self.conditions and not self.always:
            return f"(only with {' or '.join(self.conditions)}) {text}".strip()
        return text


def _type(node: dict) -> str:
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " or ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kinds = node.get("type")
    if isinstance(kinds, list):
        return " or ".join(kinds)
    if kinds:
        return kinds
    if "oneOf" in node or "anyOf" in node:
        return " or ".join(_type(n) or "object" for n in node.get("oneOf", node.get("anyOf", [])))
    if "$ref" in node:
        return "object"
    return ""


def _resolve(root: dict, node: dict) -> dict:
    ref = node.get("$ref")
    if not ref:
        return node
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target


def keys(schema: dict) -> dict[str, Key]:
    """Every key path of the schema, in the schema's order."""
    found: dict[str, Key] = {}

    def add(path: str, node: dict, condition: str | None) -> None:
        key = found.setdefault(path, Key(path))
        kind = _type(node)
        # A conditional branch narrows a key's type (a `const`); the unconditional type says it all.
        if kind and kind not in key.types and (condition is None or not key.always):
            key.types = [kind] if condition is None else key.types + [kind]
        if "default" in node and not key.default:
            key.default = f"`{json.dumps(node['default'])}`"
        if node.get("description"):
            key.descriptions.append((condition, " ".join(str(node["description"]).split())))
        if condition is None:
            key.always = True
        elif condition not in key.conditions:
            key.conditions.append(condition)

    def walk(node: dict, path: str, condition: str | None, seen: tuple[str, ...] = ()) -> None:
        node = _resolve(schema, node)
        for name, child in node.get("properties", {}).items():
            child_path = f"{path}.{name}" if path else name
            add(child_path, _resolve(schema, child), condition)
            walk(child, child_path, condition, seen)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            child_path = f"{path}.<{_placeholder(path)}>"
            add(child_path, _resolve(schema, extra), condition)
            walk(extra, child_path, condition, seen)
        items = node.get("items")
        if isinstance(items, dict):
            walk(items, f"{path}[]", condition, seen)
        for branch in node.get("oneOf", []) + node.get("anyOf", []):
            ref = branch.get("$ref", "")
            if ref not in seen:
                walk(branch, path, condition, (*seen, ref))
        for part in node.get("allOf", []):
            when = _condition(part.get("if", {}))
            for arm in ("then", "else"):
                if arm in part:
                    walk(part[arm], path, when if arm == "then" else condition, seen)

    walk(schema, "", None)
    return found


def _placeholder(path: str) -> str:
    """The name a mapping's keys stand for: a rule's name in threads and resources, else `name`."""
    return "rule" if path.split(".")[0] in ("threads", "resources") else "name"


def _condition(node: dict) -> str | None:
    properties = node.get("properties", {}).items()
    parts = [f"{name}: {json.dumps(p['const'])}" for name, p in properties if "const" in p]
    return ", ".join(parts) or None


def render(schema: dict) -> str:
    rows = []
    for key in keys(schema).values():
        cells = [f"`{key.path}`", " or ".join(key.types), key.default, key.description()]
        rows.append("| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |\n")
    return INTRO + "".join(rows)


def main(argv: list[str] | None = None) -> int:
    import yaml

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m encoder_study.core.config_doc workflow/schemas/config.schema.yaml",
              file=sys.stderr)
        return 2
    sys.stdout.write(render(yaml.safe_load(Path(argv[0]).read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
