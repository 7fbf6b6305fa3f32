"""config/README.md names exactly the config schema's keys; the generator walks every schema construct."""

import re

import yaml

from conftest import ROOT
from encoder_study.core import config_doc

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
README = ROOT / "config" / "README.md"
REGENERATE = ("regenerate it: python -m encoder_study.core.config_doc workflow/schemas/config.schema.yaml"
              " > config/README.md")


def _readme_keys() -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", README.read_text(encoding="utf-8"), re.MULTILINE)


def test_readme_names_every_schema_key_and_no_other():
    schema_keys = set(config_doc.keys(yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))))
    readme_keys = _readme_keys()
    assert len(readme_keys) == len(set(readme_keys)), "a key is listed twice"
    missing, extra = sorted(schema_keys - set(readme_keys)), sorted(set(readme_keys) - schema_keys)
    assert not missing, f"in the schema, not in config/README.md: {missing}; {REGENERATE}"
    assert not extra, f"in config/README.md, not in the schema: {extra}; {REGENERATE}"
    for key in ("models[].repo", "tagging.runs[].mode", "threads.<rule>", "resources.<rule>.gpu",
                "retrieval.model.revision", "student.corpus.streams[].configs.<name>"):
        assert key in schema_keys, key


def test_walker_covers_conditions_maps_lists_and_refs():
    schema = {
        "type": "object",
        "properties": {
            "entries": {"type": "array", "description": "Things.", "items": {
                "type": "object", "properties": {"kind": {"enum": ["a", "b"]}},
                "allOf": [
                    {"if": {"properties": {"kind": {"const": "a"}}},
                     "then": {"properties": {"kind": {"const": "a"}, "only_a": {"type": "string"},
                                             "both": {"type": "string", "description": "A's."}}}},
                    {"if": {"properties": {"kind": {"const": "b"}}},
                     "then": {"properties": {"kind": {"const": "b"}, "both": {"type": "string",
                                                                              "description": "B's."}}}},
                ]}},
            "threads": {"type": "object", "default": {},
                        "properties": {"default": {"type": "integer", "default": 1}},
                        "additionalProperties": {"type": "integer"}},
            "pick": {"oneOf": [{"type": "string"}, {"$ref": "#/properties/entries/items"}]},
        },
    }
    keys = config_doc.keys(schema)
    assert list(keys) == ["entries", "entries[].kind", "entries[].only_a", "entries[].both", "threads",
                          "threads.default", "threads.<rule>", "pick", "pick.kind", "pick.only_a",
                          "pick.both"]
    assert keys["entries[].kind"].types == ['`"a"` or `"b"`'] and keys["entries[].kind"].description() == ""
    assert keys["entries[].only_a"].description() == '(only with kind: "a")'
    assert keys["entries[].both"].description() == \
        '(only with kind: "a" or kind: "b") with kind: "a": A\'s; with kind: "b": B\'s'
    assert keys["threads"].default == "`{}`" and keys["pick"].types == ["string or object"]
    text = config_doc.render(schema)
    assert "| `threads.default` | integer | `1` |  |\n" in text and text.startswith(config_doc.INTRO)
