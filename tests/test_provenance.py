"""Provenance fragments, their join, and verify catching changed or missing files."""

from pathlib import Path

import pytest

from encoder_study import cli, files, provenance, tables


def command(*argv: str) -> int:
    """`encoder-study provenance ...` in this process (cli re-executes itself unless PYTHONHASHSEED is 0)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONHASHSEED", "0")
        return cli.main(["provenance", *argv])


def _fragment(tmp_path: Path) -> tuple[Path, Path, Path]:
    data = tmp_path / "results" / "table.csv"
    data.parent.mkdir(parents=True)
    data.write_text("a,b\n1,2\n")
    inp = tmp_path / "config.json"
    inp.write_text("{}")
    frag = tmp_path / "provenance" / "demo" / "make_table-x.md"
    with provenance.Fragment(frag, {"seed": 3}, threads=2, argv=["encoder-study", "demo"]) as f:
        f.inputs.append(inp)
        f.outputs += [data, frag]  # the fragment itself is never hashed into itself
        f.table("Table", tables.markdown_table(["a", "b"], [(1, 2)]))
    return frag, inp, data


def test_fragment_records_files_settings_and_table(tmp_path):
    frag, inp, data = _fragment(tmp_path)
    text = frag.read_text()
    assert text.startswith("# make_table (x)\n")
    assert "| seed | 3 |" in text and "| recipe | demo |" in text and "## Table" in text
    assert "| command | `encoder-study demo` |" in text
    rows = provenance.fragment_files(text)
    assert [(r[0], r[1]) for r in rows] == [("input", inp.as_posix()), ("output", data.as_posix())]
    assert rows[1][3] == files.sha256_file(data) and rows[1][2] == data.stat().st_size


def test_verify_passes_then_names_a_changed_and_a_missing_file(tmp_path):
    frag, inp, data = _fragment(tmp_path)
    root = tmp_path / "provenance"
    assert provenance.verify(root, ".") == []
    assert command("verify", "--root", str(root), "--base", ".") == 0
    data.write_text("a,b\n1,3\n")
    inp.unlink()
    problems = provenance.verify(root, ".")
    assert len(problems) == 2
    assert any(str(data) in p and "changed" in p for p in problems)
    assert any(str(inp) in p and "missing" in p for p in problems)
    assert command("verify", "--root", str(root), "--base", ".") == 1


def test_verify_without_fragments_fails(tmp_path):
    assert provenance.verify(tmp_path, ".") and command("verify", "--root", str(tmp_path), "--base", ".") == 1


def test_failed_work_writes_no_fragment(tmp_path):
    frag = tmp_path / "p" / "r" / "rule.md"
    try:
        with provenance.Fragment(frag):
            raise ValueError("boom")
    except ValueError:
        pass
    assert not frag.exists()


def test_join_keeps_the_given_order_and_demotes_headings(tmp_path):
    a, b = tmp_path / "b_first.md", tmp_path / "a_second.md"
    a.write_text("# first\n\n## Files\n")
    b.write_text("# second\n")
    out = tmp_path / "PROVENANCE.md"
    provenance.join("demo", [a, b], out)
    text = out.read_text()
    assert text.index("## first") < text.index("## second") and "### Files" in text
    assert text.startswith("# Provenance of the `demo` recipe")
    again = tmp_path / "again.md"
    assert command("join", "--recipe", "demo", "--out", str(again), str(a), str(b)) == 0
    assert again.read_text() == text


def test_tree_sha256_is_the_documented_recipe(tmp_path):
    import hashlib

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("b")
    (tmp_path / "d" / "sub" / "a.txt").write_text("a")
    lines = "".join(f"{files.sha256_file(tmp_path / 'd' / p)}  {p}\n" for p in ["b.txt", "sub/a.txt"])
    assert files.tree_sha256(tmp_path / "d") == hashlib.sha256(lines.encode()).hexdigest()


def test_write_torch_gives_bytes_that_depend_on_the_object_alone(tmp_path):
    """torch.save names its archive after the file; written through files.write_torch, equal objects
    give equal files whatever their paths (the distilled student's SHA-256 is in its export.json)."""
    import torch

    record = {"weights": torch.arange(6, dtype=torch.float32).reshape(2, 3), "steps": 3}
    files.write_torch(tmp_path / "a.pt", record)
    files.write_torch(tmp_path / "sub" / "other-name.pt", record)
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "sub" / "other-name.pt").read_bytes()
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["weights"], record["weights"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "sub"]  # no temporary file left
