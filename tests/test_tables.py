"""CSV tables: floats (numpy's too) as the shortest round-trip repr, quoting, column order, reading back."""

import csv
import io

import numpy as np
import pytest

from encoder_study.core import tables


def test_numpy_float64_is_written_as_a_plain_float():
    value = np.float64(0.1) + np.float64(0.2)
    assert isinstance(value, float) and repr(value).startswith("np.float64(")  # the trap, under numpy 2
    text = tables.csv_text([{"x": value}], ["x"])
    assert text == "x\n0.30000000000000004\n"


def test_numpy_float32_reads_back_as_the_same_float32():
    value = np.float32(0.1)
    assert not isinstance(value, float)
    text = tables.csv_text([{"x": value, "y": np.float32(2.5)}], ["x", "y"])
    assert text == "x,y\n0.10000000149011612,2.5\n"  # repr(float(v)): the float32's exact value
    assert np.float32(float(text.splitlines()[1].split(",")[0])) == value


def test_python_floats_and_special_values():
    rows = [{"a": 0.1 + 0.2, "b": 1e-300, "c": 1.0, "d": -0.0, "e": float("inf"), "f": float("nan")}]
    line = tables.csv_text(rows, list("abcdef")).splitlines()[1]
    assert line == "0.30000000000000004,1e-300,1.0,-0.0,inf,nan"


def test_ints_bools_and_none():
    rows = [{"a": 3, "b": np.int64(-7), "c": True, "d": np.bool_(False), "e": None, "f": 10**20}]
    assert tables.csv_text(rows, list("abcdef")) == "a,b,c,d,e,f\n3,-7,True,False,,100000000000000000000\n"


def test_cells():
    assert tables.cell(np.float64(1.5)) == "1.5"
    assert tables.cell(np.float16(0.5)) == "0.5"
    assert tables.cell(np.int32(4)) == "4"
    assert tables.cell("np.float64(1)") == "np.float64(1)"  # strings are left as they are
    assert tables.cell(None) == ""


def test_strings_with_commas_quotes_and_newlines_are_quoted():
    rows = [{"name": 'say "hi", then go', "note": "two\nlines", "plain": "ok"}]
    text = tables.csv_text(rows, ["name", "note", "plain"])
    assert text == 'name,note,plain\n"say ""hi"", then go","two\nlines",ok\n'
    assert list(csv.DictReader(io.StringIO(text))) == rows


def test_columns_set_the_order_and_rows_keep_theirs():
    rows = [{"b": 1, "a": "x"}, {"a": "y", "b": 2}, {"a": "z"}]
    text = tables.csv_text(rows, ["b", "a"])
    assert text == "b,a\n1,x\n2,y\n,z\n"  # a missing column is an empty cell
    with pytest.raises(ValueError, match="'c'"):
        tables.csv_text([{"a": 1, "c": 2}], ["a", "b"])


def test_no_rows_gives_the_header():
    assert tables.csv_text([], ["a", "b"]) == "a,b\n"


def test_round_trip_through_a_file(tmp_path):
    rows = [{"model": "bert, tiny", "tokens": 12, "max_abs": np.float64(1 / 3), "min_cos": np.float32(0.999),
             "note": 'a "quoted" word'},
            {"model": "Příliš žluťoučký", "tokens": np.int64(0), "max_abs": 1e-17, "min_cos": 1.0,
             "note": ""}]
    columns = ["model", "tokens", "max_abs", "min_cos", "note"]
    path = tmp_path / "table.csv"
    path.write_text(tables.csv_text(rows, columns), encoding="utf-8")
    read = tables.read_csv(path)
    assert [list(r) for r in read] == [columns, columns]
    assert [r["model"] for r in read] == ["bert, tiny", "Příliš žluťoučký"]
    assert [r["note"] for r in read] == ['a "quoted" word', ""]
    assert [int(r["tokens"]) for r in read] == [12, 0]
    assert [float(r["max_abs"]) for r in read] == [1 / 3, 1e-17]  # exactly, not approximately
    assert np.float32(float(read[0]["min_cos"])) == np.float32(0.999) and float(read[1]["min_cos"]) == 1.0
    assert tables.csv_text(read, columns) == path.read_text(encoding="utf-8")  # strings write back the same
