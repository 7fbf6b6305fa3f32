"""Stored artefacts that check themselves: the SHA-256 of their own content travels inside them.

    files.write_torch(path, seal({"format": ..., "weights": ...}))      # the digest under KEY
    record = read_torch(path, "training checkpoint", CHECKPOINT_FIX, CheckpointError)  # checked

`content_sha256` hashes a value's content, not a file's bytes: nested dicts (in their order), lists and
tuples, strings, numbers, None, bytes, numpy arrays and torch tensors (dtype, shape and raw bytes).
So a record can hold its own digest (`seal` computes it over everything else), and a reader checks it
on the objects it loaded (`opened`), whatever container format stored them: a torch checkpoint
(checkpoints, the distilled student) or a safetensors header (`tagging.pipeline`). One flipped bit in
a weight, a step count or a setting is then a refusal naming the file and the way out, where torch's
reader would have returned the changed number.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np
import torch

from ..core.errors import UserError
from ..core.files import rebuild  # noqa: F401 (the way out for a damaged workflow output; one owner: files)

KEY = "content_sha256"
CHECKPOINT_FIX = "delete it to start over"


def content_sha256(value) -> str:
    """SHA-256 of a value's content (see the module); TypeError for a type it does not know."""
    digest = hashlib.sha256()
    _feed(digest, value)
    return digest.hexdigest()


def _feed(digest, value) -> None:
    """Each value as a type tag, its size where it has one, then its bytes: no two values collide."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        digest.update(f"T{data.dtype}{tuple(data.shape)}|".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, np.ndarray | np.generic):
        data = np.ascontiguousarray(value)
        digest.update(f"A{data.dtype.str}{data.shape}|".encode())
        digest.update(data.view(np.uint8).reshape(-1))
    elif isinstance(value, dict):
        digest.update(b"D%d|" % len(value))
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, list | tuple):  # a pickle keeps which; the content is the same either way
        digest.update(b"L%d|" % len(value))
        for item in value:
            _feed(digest, item)
    elif value is None or isinstance(value, bool):
        digest.update(f"B{value}|".encode())
    elif isinstance(value, int):
        digest.update(f"I{value}|".encode())
    elif isinstance(value, float):
        digest.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, str | bytes):
        data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        digest.update(b"%s%d|" % (b"S" if isinstance(value, str) else b"Y", len(data)))
        digest.update(data)
    else:
        raise TypeError(f"content_sha256: cannot hash a {type(value).__name__}")


def seal(record: dict) -> dict:
    """`record` with the SHA-256 of the rest of its content under KEY (replacing one it had)."""
    body = {k: v for k, v in record.items() if k != KEY}
    return {**body, KEY: content_sha256(body)}


def opened(record, path: str | os.PathLike, what: str, fix: str, error: type[UserError]) -> dict:
    """`record` without KEY, once its content matches the SHA-256 recorded under KEY.

    `error`, naming the file, `what` it should be and `fix`, for a record without one or with another.
    """
    if not isinstance(record, dict) or not isinstance(record.get(KEY), str):
        raise error(f"{path}: no SHA-256 of its content, so it cannot be checked: not a {what} written by "
                    f"this code (or written before {what}s carried one); {fix}")
    body = {k: v for k, v in record.items() if k != KEY}
    actual = content_sha256(body)
    if actual != record[KEY]:
        raise error(f"{path}: the {what} is damaged: its content's SHA-256 is {actual}, and it recorded "
                    f"{record[KEY]} when it was written; {fix}")
    return body


def read_torch(path: str | os.PathLike, what: str, fix: str, error: type[UserError]) -> dict:
    """The checked content (`opened`) of a torch file written as `files.write_torch(path, seal(...))`.

    Read onto the CPU with torch's weights-only reader (tensors and plain data: no code runs). `error`
    names the file, `what` and `fix` for a file torch cannot read, too.
    """
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: torch raises several types
        raise error(f"{path}: cannot read the {what} ({err}); {fix}") from err
    return opened(record, path, what, fix, error)
