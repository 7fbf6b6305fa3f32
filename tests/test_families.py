"""The encoder family registry (encoders/families): each family is recognised by its own config and
weight names, and nothing outside the registry tells families apart by their model types. Parametrised
from the registry, so a new family is tested by adding it."""

import ast
import importlib
from pathlib import Path

import pytest

from conftest import ROOT
from encoder_study.encoders import families, perf
from encoder_study.encoders.families import FAMILIES

PACKAGE = ROOT / "workflow" / "lib" / "encoder_study"


def graph_names(family: families.Family, layers: int = 2) -> set[str]:
    """The weight names (prefix removed) a graph of this family holds, from its trainable module."""
    module = importlib.import_module(f"encoder_study.encoders.trainable.{family.trainable}")
    names = module.student_names(layers) if family.named_layout else module.weight_names(layers)
    return set(names.values())


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_is_found_by_its_weight_names_and_its_configs(name):
    family = FAMILIES[name]
    assert families.detect(graph_names(family)) is family
    assert family.tokens in graph_names(family)
    for model_type in family.model_types:
        config = {"model_type": model_type, "max_position_embeddings": 514, "pad_token_id": 1,
                  "num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16}
        assert families.of_config(config) is family
        assert families.usable_positions(config) == 514 - family.lost_positions(config)
        assert perf.Shape.from_config(config).gated is family.gated
    trainable = importlib.import_module(f"encoder_study.encoders.trainable.{family.trainable}")
    assert callable(trainable.from_graph) and callable(trainable.weight_names)


def test_families_are_told_apart():
    model_types = [t for f in FAMILIES.values() for t in f.model_types]
    assert len(model_types) == len(set(model_types))
    for name, family in FAMILIES.items():
        others = [f for f in FAMILIES.values() if f is not family and f.matches(graph_names(family))]
        assert not others, f"{name}'s names also match {[f.name for f in others]}"
    # XLM-R numbers positions from padding_idx + 1; BERT from 0
    assert families.usable_positions({"model_type": "xlm-roberta", "max_position_embeddings": 514,
                                      "pad_token_id": 1}) == 512
    assert families.usable_positions({"model_type": "bert", "max_position_embeddings": 512}) == 512
    with pytest.raises(families.FamilyError, match="cannot tell the family"):
        families.detect(["embeddings.word_embeddings.weight", "pooler.dense.weight"])


def test_no_module_outside_the_registry_compares_model_types():
    """A comparison with a family's model type (`config["model_type"] == "modernbert"`, `in (...)`) is
    family knowledge; it belongs in encoders/families."""
    # ("student" is also a recipe's and a source's name: not searched for)
    known = {t for f in FAMILIES.values() for t in f.model_types} | {f.trainable for f in FAMILIES.values()}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "families" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            for operand in [node.left, *node.comparators]:
                values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                hits = [v.value for v in values if isinstance(v, ast.Constant) and v.value in known]
                found += [f"{Path(path).relative_to(ROOT)}:{node.lineno}: {hit!r}" for hit in hits]
    assert not found, "family tested outside encoders/families:\n" + "\n".join(found)
