"""The shared export check: the check batch's lengths, ONNX Runtime against a reference, the module's mode."""

import numpy as np
import pytest
import torch

from encoder_study.core.errors import UserError
from encoder_study.onnx import checked_export, manifest, runtime


class Refused(UserError):
    """The caller's own error: the shared check raises what it is given."""


@pytest.fixture(scope="module")
def bert(tiny_exports):
    return tiny_exports["bert-tiny"]


@pytest.mark.parametrize(("positions", "window", "lengths"), [
    (128, 0, [48, 32, 5]),  # the usual rows
    (20, 0, [20, 13, 5]),  # capped at the positions, two-thirds rounded down
    (4, 0, [4, 2, 4]),  # no row longer than the positions
    (128, 30, [68, 45, 5]),  # past twice the window (2 x 30 + 8)
    (16, 8, [16, 11, 5]),  # the middle row past the window (8 + 3), beyond two-thirds of 16
])
def test_check_batch_lengths(bert, positions, window, lengths):
    tokenizer = bert / manifest.TOKENIZER_FILE
    ids, mask = checked_export.check_batch(tokenizer, positions, 7, window, error=Refused)
    assert mask.sum(axis=1).tolist() == lengths
    assert ids.shape == mask.shape == (3, max(lengths)) and ids.dtype == mask.dtype == np.int64
    assert (ids[mask == 0] == 7).all() and (mask[:, 0] == 1).all()


def test_check_batch_refuses_rows_the_text_cannot_fill(bert):
    with pytest.raises(Refused, match="the check text gives"):
        checked_export.check_batch(bert / manifest.TOKENIZER_FILE, 100_000, 0, 50_000, error=Refused)


def test_check_measures_real_tokens_against_the_reference(bert):
    path = bert / manifest.ONNX_FILE
    batch = checked_export.check_batch(bert / manifest.TOKENIZER_FILE, 128, 0, error=Refused)
    ids, mask = batch
    got = runtime.ort_session(path, 1).run(None, {"input_ids": ids, "attention_mask": mask})[0]
    reference = got.astype(np.float64)
    reference[0, 3, 1] += 0.25
    padded = np.argwhere(mask == 0)[0]
    reference[padded[0], padded[1], 0] += 100.0  # a padded position: not compared, not the largest value
    settings = {"threads": 1, "optimization": "all", "what": "model 'x'", "error": Refused}
    check = checked_export.check(path, batch, reference, tolerance=1.0, **settings)
    largest = float(np.abs(reference[mask.astype(bool)]).max())
    assert check["max_abs"] == pytest.approx(0.25, abs=1e-6)
    assert check["max_value"] == largest and check["relative"] == check["max_abs"] / max(1.0, largest)
    assert check["lengths"] == [48, 32, 5] and check["padded_to"] == 48
    assert check["criterion"] == checked_export.CRITERION and check["ort_optimization"] == "all"
    with pytest.raises(Refused, match=r"model 'x': ONNX Runtime differs .* nothing was written"):
        checked_export.check(path, batch, reference, tolerance=0.01, **settings)
    reference[1, 0, 0] = np.nan
    with pytest.raises(Refused, match="nothing was written"):
        checked_export.check(path, batch, reference, tolerance=1.0, **settings)


def test_pytorch_output_runs_in_eval_mode_and_keeps_the_mode():
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, input_ids, attention_mask):
            return self.drop(torch.ones(input_ids.shape) * attention_mask)

    module = Noisy().train()
    mask = np.array([[1, 1, 0]], dtype=np.int64)
    out = checked_export.pytorch_output(module, (np.zeros_like(mask), mask))
    assert out.tolist() == [[1.0, 1.0, 0.0]]  # no dropout
    assert module.training and module.drop.training
