"""The dependency walk's cache (encoder_study.provenance.deps, `cache=`): the same files as a full
parse, and a file whose bytes changed is parsed again, whatever its size and time stamps say."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from encoder_study import cli
from encoder_study.provenance import deps

LIB = ROOT / "workflow" / "lib"


def fresh_walk(root: Path, module: str, function: str | None, cache: Path) -> list[str]:
    """code_files in a new process: the cache file is all it carries over from an earlier walk."""
    code = ("import json, sys\nfrom encoder_study.provenance import deps\n"
            "print(json.dumps(deps.code_files(*json.loads(sys.argv[1]))))")
    argv = json.dumps([str(root), module, function, str(cache)])
    result = subprocess.run([sys.executable, "-c", code, argv], env={**os.environ, "PYTHONPATH": str(LIB)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _package(root: Path, sources: dict[str, str]) -> None:
    for name, text in {"__init__.py": "", "cli.py": "", **sources}.items():
        path = root / "encoder_study" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(("command", "function"), [("tagging", "train"), ("writeback", "pipeline"),
                                                   ("provenance", None)])
def test_cached_walk_gives_the_parsed_walks_files(tmp_path, command, function):
    module = cli.COMMANDS[command]
    cache = tmp_path / "deps.json"
    parsed = deps.code_files(LIB, module, function)
    assert fresh_walk(LIB, module, function, cache) == parsed  # fills the cache
    assert cache.is_file()
    assert fresh_walk(LIB, module, function, cache) == parsed  # reads it


def test_a_changed_file_of_the_same_size_and_times_is_parsed_again(tmp_path):
    _package(tmp_path, {"commands/__init__.py": "", "commands/a.py": "from .. import bb\n",
                        "bb.py": "", "cc.py": ""})
    cache = tmp_path / "deps.json"
    module = "encoder_study.commands.a"
    assert any(p.endswith("bb.py") for p in fresh_walk(tmp_path, module, None, cache))
    source = tmp_path / "encoder_study" / "commands" / "a.py"
    times = source.stat()
    source.write_text("from .. import cc\n")  # same size
    os.utime(source, ns=(times.st_atime_ns, times.st_mtime_ns))  # and the same times
    assert source.stat().st_size == times.st_size and source.stat().st_mtime_ns == times.st_mtime_ns
    found = fresh_walk(tmp_path, module, None, cache)
    assert any(p.endswith("cc.py") for p in found) and not any(p.endswith("bb.py") for p in found)


def test_a_damaged_or_unwritable_cache_is_ignored(tmp_path):
    _package(tmp_path, {"commands/__init__.py": "", "commands/a.py": "from .. import bb\n", "bb.py": ""})
    module = "encoder_study.commands.a"
    expected = deps.code_files(tmp_path, module)
    cache = tmp_path / "deps.json"
    cache.write_text("{not json")
    assert fresh_walk(tmp_path, module, None, cache) == expected
    assert json.loads(cache.read_text())["files"]  # written again, whole
    cache.write_text(json.dumps({**deps.CACHE_FORMAT, "format": -1, "files": {"x": 1}}))  # another format
    assert fresh_walk(tmp_path, module, None, cache) == expected
    blocked = tmp_path / "a-file" / "deps.json"  # its folder cannot be made: a file is in the way
    (tmp_path / "a-file").write_text("")
    assert fresh_walk(tmp_path, module, None, blocked) == expected
