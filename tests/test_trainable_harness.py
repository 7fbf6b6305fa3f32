"""The training harness: device choice and CUDA settings (checked here through fakes), precision,
progress lines, and a toy loop's chunked checkpoints and resuming against a plain loop."""

from __future__ import annotations

import pytest
import torch

from encoder_study.core import files
from encoder_study.encoders.trainable import harness
from encoder_study.encoders.trainable.harness import TrainingError
from encoder_study.provenance import artefacts


def test_resolve_device(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert harness.resolve_device("cpu", 1) == torch.device("cpu")
    assert "CUBLAS_WORKSPACE_CONFIG" not in harness.os.environ  # nothing set for a CPU run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert harness.resolve_device("auto", 1) == torch.device("cpu")
    with pytest.raises(TrainingError, match=r"--device cuda, but torch .* sees no GPU.*envs/torch-cuda.txt"
                                            r".*--device auto or cpu"):
        harness.resolve_device("cuda")
    with pytest.raises(TrainingError, match="expected one of auto, cpu or cuda"):
        harness.resolve_device("gpu")

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what a GPU node gives: the rank's GPU
    assert harness.resolve_device("auto", 1) == torch.device("cuda", 1)
    assert harness.resolve_device(None) == torch.device("cuda", 0)
    # Set before CUDA starts (cuBLAS reads it once), so that its reductions repeat.
    assert harness.os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert harness.resolve_device("cuda", 1) == torch.device("cuda", 1)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    with pytest.raises(TrainingError, match="CUBLAS_WORKSPACE_CONFIG is ':0:0'"):
        harness.resolve_device("cuda")
    assert harness.resolve_device("cpu") == torch.device("cpu")
    assert harness.describe_device("cpu") == "cpu"


def test_deterministic_is_strict_on_cuda_and_restores_what_it_changed():
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    flags = lambda: (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)  # noqa: E731
    before = flags()
    try:  # set by hand and restored by hand: cuBLAS's module object cannot be monkeypatched
        cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = False, True, True, True
        with harness.deterministic("cpu", 1):
            assert torch.is_deterministic_algorithms_warn_only_enabled()
            assert flags() == (False, True, True, True)
        with harness.deterministic(torch.device("cuda", 0), 1):  # sets flags only: no GPU needed
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert flags() == (True, False, False, False)
            assert torch.get_num_threads() == 1
        assert flags() == (False, True, True, True)
    finally:
        cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = before


def test_precision():
    with pytest.raises(TrainingError, match="expected one of"):
        harness.check_precision("fp16", torch.device("cpu"))
    harness.check_precision("bf16", "cpu")
    a = torch.ones(2, 2)
    with harness.autocast("cpu", "bf16"):
        assert (a @ a).dtype == torch.bfloat16
    with harness.autocast(torch.device("cpu"), "fp32"):
        assert (a @ a).dtype == torch.float32


def test_progress_line_and_seconds():
    assert harness.format_seconds(3725.4) == "1:02:05"
    # 5 steps in 50 s: the 5 left take 50 s more.
    assert harness.progress_line("run", 15, 20, "loss 1", 50.0, 5) == \
        "run: step 15/20, loss 1, elapsed 0:00:50, left 0:00:50"


class Crash(Exception):
    pass


class Toy(harness.Loop):
    """x <- x / 2 + a draw from torch's generator, STEPS times: the state and the RNG must both resume."""

    FORMAT, WHAT, STEPS = "test.toy/1", "toy checkpoint", 5

    def __init__(self, checkpoint, chunks: str, crash_at: int | None = None):
        super().__init__(checkpoint, torch.device("cpu"))
        self.CHUNKS, self.crash_at = chunks, crash_at
        torch.manual_seed(0)
        self.x = torch.zeros(3)
        self.resume()

    def train_step(self):
        if self.step == self.crash_at:
            raise Crash
        self.x = self.x / 2 + torch.rand(3)
        self.step += 1

    def finished(self):
        return self.step >= self.STEPS

    def total_steps(self):
        return self.STEPS

    def report(self):
        return f"x {self.x.sum().item():.3f}" if self.step % 2 == 0 else None

    def state(self):
        return {"x": self.x, "rng": harness.rng_state(self.device)}

    def restore(self, state):
        self.x = state["x"]
        harness.set_rng_state(state["rng"], self.device)


def _saved(checkpoint) -> dict:
    """The checkpoint as the harness reads it: its own SHA-256 checked."""
    return artefacts.read_torch(checkpoint, Toy.WHAT, artefacts.CHECKPOINT_FIX, files.CheckpointError)


@pytest.mark.parametrize("chunks, expected", [("invocation", [(1, 2), (3, 5)]),
                                              ("save", [(1, 2), (3, 4), (5, 5)])])
def test_a_loop_resumed_after_a_crash_ends_where_a_plain_loop_ends(tmp_path, capsys, chunks, expected):
    torch.manual_seed(0)
    plain = torch.zeros(3)
    for _ in range(Toy.STEPS):
        plain = plain / 2 + torch.rand(3)
    checkpoint = tmp_path / "toy.pt"
    with pytest.raises(Crash):  # dies before step 4, after the save at step 2
        Toy(checkpoint, chunks, crash_at=3).train(chunk_steps=2, progress=True, desc="toy")
    assert _saved(checkpoint)["step"] == 2
    resumed = Toy(checkpoint, chunks)
    assert resumed.resumed_from == 2
    resumed.train(chunk_steps=2, progress=True, desc="toy")
    assert torch.equal(resumed.x, plain)
    assert [(c["first_step"], c["last_step"]) for c in resumed.chunks] == expected
    saved = _saved(checkpoint)  # the finished state
    assert saved["step"] == 5 and torch.equal(saved["x"], plain)
    lines = capsys.readouterr().err.splitlines()
    # The log says where each checkpoint went and where the retry resumed from.
    assert [line.split(",")[0] for line in lines] == [
        "toy: step 2/5", f"toy: toy checkpoint at step 2 saved to {checkpoint}",
        f"toy: resumed from the toy checkpoint {checkpoint} at step 2",
        "toy: step 4/5", f"toy: toy checkpoint at step 4 saved to {checkpoint}",
        f"toy: toy checkpoint at step 5 saved to {checkpoint} (finished)"]
