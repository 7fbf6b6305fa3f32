"""files.read_json: the one JSON reader, and the message it gives for each way a file can be wrong."""

from __future__ import annotations

import pytest

from encoder_study.core import files
from encoder_study.core.errors import UserError


class OwnError(UserError):
    pass


def test_read_json_returns_the_value(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"b": [1, 2.5, "ü"], "a": null}', encoding="utf-8")
    assert files.read_json(path, "a record", "rewrite it", kind=dict) == {"b": [1, 2.5, "ü"], "a": None}
    path.write_text("[1]")
    assert files.read_json(path, "a list", "rewrite it") == [1]  # no kind: any JSON value


@pytest.mark.parametrize(("text", "said"), [
    (None, r"a.json is missing: expected a record; rewrite it$"),
    ("{not json", r"a.json: cannot read a record \(Expecting property name .*\); rewrite it$"),
    (b"\xff\xfe", r"a.json: cannot read a record \(.*codec can't decode.*\); rewrite it$"),
    ("[1, 2]", r"a.json: expected a record \(a JSON object\), found a JSON array; rewrite it$"),
])
def test_read_json_names_the_file_what_was_wrong_and_the_fix(tmp_path, text, said):
    path = tmp_path / "a.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(files.JsonError, match=said):
        files.read_json(path, "a record", "rewrite it", kind=dict)
    with pytest.raises(OwnError, match=said):  # the caller's own error class
        files.read_json(path, "a record", "rewrite it", kind=dict, error=OwnError)


def test_read_json_refuses_a_directory(tmp_path):
    with pytest.raises(files.JsonError, match=r": cannot read a record \(.*\); rewrite it$"):
        files.read_json(tmp_path, "a record", "rewrite it")
