"""The distilled student: `architecture`, `data`, `objective`, `train`, and `export` (ONNX + parity)."""

from ...core.errors import UserError


class StudentError(UserError):
    """A setting, corpus or file the distillation cannot use: the message names it and the fix."""
