"""The graph variants of ONNX Runtime's transformer optimizer (onnx/fusion.py) on the tiny models: what
each fuses, and that each computes what the exported graph computes (run directly by onnxruntime)."""

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import TINY
from encoder_study.encoders import families
from encoder_study.onnx import fusion, manifest


def run(path, ids, mask) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})[0]


@pytest.mark.parametrize("name", TINY)
def test_every_variant_computes_the_exported_graph(tiny_exports, name, tmp_path):
    config = json.loads((tiny_exports[name] / manifest.CONFIG_FILE).read_text())
    source = tiny_exports[name] / manifest.ONNX_FILE
    graphs = fusion.variants(source, config, tmp_path, families.of_config(config).ort_model_type)
    assert list(graphs) == list(fusion.VARIANTS) and graphs["exported"][0] == source
    ids = np.random.default_rng(0).integers(5, config["vocab_size"], size=(3, 24), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 15:] = mask[2, 6:] = 0  # padded rows: the attention mask must still be read
    expected = run(source, ids, mask)[mask == 1]
    layers = config["num_hidden_layers"]
    for variant, (path, record) in graphs.items():
        np.testing.assert_allclose(run(path, ids, mask)[mask == 1], expected, atol=1e-5, rtol=0)
        ops = Counter(node.op_type for node in onnx.load(path).graph.node)
        if variant == "exported":
            continue
        assert record["num_heads"] == config["num_attention_heads"] and record["model_type"] == "bert"
        assert {op: ops[op] for op in record["fused"]} == record["fused"]  # the record says what the file has
        assert ops["SkipLayerNormalization"] == (0 if variant == "ort-attention" else 2 * layers)
        # attention is fused where ONNX Runtime knows the pattern: BERT and XLM-R, not ModernBERT's
        assert ops["Attention"] == (0 if config["model_type"] == "modernbert" else layers)


def test_settings_per_architecture_and_refusals(tmp_path):
    for kind in ("bert", "xlm-roberta", "modernbert"):
        config = {"model_type": kind, "num_attention_heads": 12, "hidden_size": 768}
        expected = {"model_type": "bert", "num_heads": 12, "hidden_size": 768}
        assert fusion.optimizer_settings(config, families.of_config(config).ort_model_type) == expected
    student = {"model_type": families.student.MODEL_TYPE, "num_attention_heads": 1, "hidden_size": 2}
    with pytest.raises(fusion.FusionError, match="no ONNX Runtime optimizer model type for .*'encoder_"):
        fusion.optimizer_settings(student, families.of_config(student).ort_model_type)
    with pytest.raises(families.FamilyError, match="model_type 'gpt2' is of no encoder family"):
        families.of_config({"model_type": "gpt2"})
    with pytest.raises(fusion.FusionError, match="unknown graph variant"):
        fusion.optimize("model.onnx", tmp_path / "x.onnx", {}, "fastest", "bert")
    with pytest.raises(fusion.FusionError, match="nothing to write"):
        fusion.optimize("model.onnx", tmp_path / "x.onnx", {}, "exported", "bert")
    assert fusion.fused_text({"fused": {"Attention": 2, "BiasGelu": 2}}) == "Attention 2, BiasGelu 2"
    assert fusion.fused_text({"fused": {}}) == "none"
