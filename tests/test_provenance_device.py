"""The device record of every fragment and ONNX Runtime's execution provider choice (CUDA refused
clearly where it is missing; the CUDA paths run here through the same code with fakes)."""

from __future__ import annotations

import os

import pytest

from encoder_study import provenance
from encoder_study.encoders.frozen import FrozenEncoder
from encoder_study.onnx import manifest, runtime


def fake_nvidia_smi(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + script)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_gpus_and_driver_come_from_nvidia_smi(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, 'echo "0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06"\n'
                                           'echo "1, NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06"\n')
    facts = provenance.device()
    assert facts["gpus"] == "0: NVIDIA H100 80GB HBM3 (81559 MiB); 1: NVIDIA H100 80GB HBM3 (81559 MiB)"
    assert facts["gpu driver"] == "580.65.06"


def test_no_gpu_is_recorded_without_failing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert provenance.nvidia_gpus() == {"gpus": "none (no nvidia-smi)"}
    fake_nvidia_smi(tmp_path, monkeypatch,
                    'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA '
                    'driver." >&2\nexit 9\n')
    assert provenance.nvidia_gpus() == {
        "gpus": "none (nvidia-smi exit 9: NVIDIA-SMI has failed because it could not communicate with "
                "the NVIDIA driver.)"}


def test_cpu_flags_keep_the_simd_and_matrix_features():
    x86 = "processor\t: 0\nflags\t\t: fpu vme avx2 sse4_2 avx512f avx512_bf16 amx_tile fma pse\n"
    assert provenance.cpu_flags(x86) == "amx_tile avx2 avx512_bf16 avx512f fma sse4_2"
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\n"
    assert provenance.cpu_flags(arm) == "asimd bf16 i8mm sve"
    assert provenance.cpu_flags("processor\t: 0\n") == "unknown"


def test_the_device_section_is_in_every_fragment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out.txt").write_text("x")
    with provenance.Fragment(tmp_path / "provenance/r/rule.md", {}) as frag:
        frag.outputs.append("out.txt")
    text = (tmp_path / "provenance/r/rule.md").read_text()
    assert "\n## Device\n" in text and "| cpu flags |" in text and "| gpus |" in text
    assert "| onnxruntime providers available |" in text


def test_cpu_is_the_default_provider_and_cuda_is_refused_where_missing():
    assert runtime.providers_for("cpu") == ["CPUExecutionProvider"]
    assert runtime.providers_for("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == \
        ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(runtime.ProviderError, match="offers only CPUExecutionProvider.*onnxruntime-gpu"):
        runtime.providers_for("cuda", ["CPUExecutionProvider"])
    with pytest.raises(runtime.ProviderError, match="expected one of"):
        runtime.providers_for("tensorrt")


def test_the_frozen_encoder_records_its_provider_and_refuses_cuda_here(tiny_exports):
    import onnxruntime as ort

    model = tiny_exports["bert-tiny"]
    encoder = FrozenEncoder(model, provider="cpu")
    assert encoder.settings()["provider"] == "cpu"
    assert encoder.settings()["onnxruntime"]["providers"] == ["CPUExecutionProvider"]
    assert "CPUExecutionProvider" in provenance.device()["onnxruntime providers used"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has a CUDA provider")
    with pytest.raises(runtime.ProviderError, match="CUDA execution provider was asked for"):
        FrozenEncoder(model, provider="cuda")
    assert (model / manifest.ONNX_FILE).is_file()
