"""Text selection: the Tatoeba and UDHR readers, fetching, cutting, the selection rule, the command.

Everything is offline: sources are small files in the real formats built here, the committed sample
under config/texts, and file:// URLs for the download function.
"""

import hashlib
import io
import json
import random
import tarfile
import unicodedata
import zipfile
from pathlib import Path

import pytest
import regex

from conftest import ROOT, cli_runner
from encoder_study.core import files
from encoder_study.data import fetch, texts
from encoder_study.recipes.parity import selection

command = cli_runner("parity")

SAMPLE_TATOEBA = ROOT / "config" / "texts" / "tatoeba_sample.tsv"
SAMPLE_UDHR = ROOT / "config" / "texts" / "udhr_sample"


# --- builders for the real formats ----------------------------------------------------------------

def tatoeba_file(path: Path, lines: list[str]) -> Path:
    """A sentences.csv: the lines as given (fields already MySQL-escaped), each ended by a newline."""
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    return path


def tar_bz2(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:bz2") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def udhr_xml(key: str, sections: list[tuple[str, list[str]]], attrs: str | None = None,
             namespace: str = texts.UDHR_NS) -> bytes:
    """A UDHR document: sections are ('preamble', paras), (number, paras) or ('list:N', items)."""
    if attrs is None:
        lang = key.split("_")[0]
        attrs = f"iso639-3='{lang}' iso15924='Latn'"
    out = [f"<?xml version='1.0' encoding='UTF-8'?>\n<udhr xmlns='{namespace}' key='{key}' n='Test' "
           f"xml:lang='xx' {attrs}>\n<title>Title is not text</title>\n"]
    for name, paras in sections:
        if name == "preamble":
            out.append("<preamble><title>Preamble</title>")
            out += [f"<para>{p}</para>" for p in paras]
            out.append("</preamble>\n")
        elif name.startswith("list:"):
            out.append(f"<article number='{name[5:]}'><title>Article</title><orderedlist>")
            out += [f"<listitem tag='{i}.'><para>{p}</para></listitem>" for i, p in enumerate(paras, 1)]
            out.append("</orderedlist></article>\n")
        else:
            out.append(f"<article number='{name}'><title>Article {name}</title>")
            out += [f"<para>{p}</para>" for p in paras]
            out.append("</article>\n")
    out.append("</udhr>\n")
    return "".join(out).encode("utf-8")


def plain(records):
    return [(t.id, t.source, t.lang, t.script, t.text) for t in records]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- Tatoeba --------------------------------------------------------------------------------------

TATOEBA_LINES = [
    "10\teng\tThe cat sleeps.",
    "11\t\\N\tNobody said which language this is.",
    "12\tcycl\t(#$isa #$Cat #$Animal)",
    "13\tfra\tUn onglet\\\tici.",            # an escaped tab inside the text
    "14\tdeu\tErste Zeile\\",                # an escaped newline: the record goes on
    "und zweite Zeile.",
    "15\tces\tZpětné lomítko \\\\ zde.",     # an escaped backslash
    "16\tzzz\tA language the registry does not know.",
    "17\tpes\tمی\u200cخواهم",
]


def test_tatoeba_reader_plain_and_tar_bz2(tmp_path):
    csv = tatoeba_file(tmp_path / "sentences.csv", TATOEBA_LINES)
    archive = tar_bz2(tmp_path / "sentences.tar.bz2", {"sentences.csv": csv.read_bytes()})
    stats = texts.SourceStats()
    from_csv = list(texts.read_tatoeba(csv, stats))
    assert plain(from_csv) == plain(texts.read_tatoeba(archive))
    assert plain(from_csv) == [
        ("tatoeba:10", "tatoeba", "eng", "Latn", "The cat sleeps."),
        ("tatoeba:13", "tatoeba", "fra", "Latn", "Un onglet\tici."),
        ("tatoeba:14", "tatoeba", "deu", "Latn", "Erste Zeile\nund zweite Zeile."),
        ("tatoeba:15", "tatoeba", "ces", "Latn", "Zpětné lomítko \\ zde."),
        ("tatoeba:16", "tatoeba", "zzz", None, "A language the registry does not know."),
        ("tatoeba:17", "tatoeba", "pes", "Arab", "می\u200cخواهم"),
    ]
    assert (stats.records, stats.no_language, stats.not_iso) == (8, 1, 1)
    assert from_csv[2].where.endswith("line 5")  # the record that spans two lines starts on line 5
    assert from_csv[3].where.endswith("line 7")


def test_tatoeba_archive_must_hold_one_export(tmp_path):
    archive = tar_bz2(tmp_path / "odd.tar.bz2", {"a.csv": b"1\teng\tx\n", "b.csv": b"2\teng\ty\n"})
    with pytest.raises(texts.TextError, match=r"odd\.tar\.bz2: expected one sentences\.csv"):
        list(texts.read_tatoeba(archive))
    nested = tar_bz2(tmp_path / "nested.tar.bz2", {"exports/sentences.csv": b"1\teng\tx\n", "README": b"r"})
    assert [t.id for t in texts.read_tatoeba(nested)] == ["tatoeba:1"]


@pytest.mark.parametrize("bad, message", [
    ("3\teng", r"line 2: expected 3 tab-separated fields .*found 2"),
    ("3\teng\tx\ty", r"line 2: expected 3 tab-separated fields .*found 4"),
    ("x3\teng\tHello.", r"line 2: sentence id 'x3' is not a positive integer"),
    ("0\teng\tHello.", r"line 2: sentence id '0' is not a positive integer"),
    ("\\N\teng\tHello.", r"line 2: sentence id \\N is not a positive integer"),
    ("3\teng\t   ", r"line 2: sentence 3 has empty text; remove the line"),
    ("3\tEN\tHello.", r"line 2: language code 'EN' is not well-formed: an ISO 639-3 code is three lowercase"),
    ("3\ten\tHello.", r"line 2: language code 'en' is not well-formed"),
    ("1\teng\tAgain.", r"line 2: sentence id 1 occurs on an earlier line too"),
])
def test_tatoeba_malformed_lines_name_file_and_line(tmp_path, bad, message):
    path = tatoeba_file(tmp_path / "sentences.csv", ["1\teng\tFirst.", bad, "9\teng\tLast."])
    with pytest.raises(texts.TextError, match=message) as info:
        list(texts.read_tatoeba(path))
    assert str(path) in str(info.value)


def test_tatoeba_not_utf8_names_line(tmp_path):
    path = tmp_path / "sentences.csv"
    path.write_bytes(b"1\teng\tok\n2\teng\t\xff\xfe\n")
    with pytest.raises(texts.TextError, match=r"sentences\.csv, line 2: not UTF-8"):
        list(texts.read_tatoeba(path))


def test_tatoeba_nul_byte_names_line(tmp_path):
    path = tmp_path / "sentences.csv"
    path.write_bytes(b"1\teng\tok\n2\teng\tbro\x00ken\n")
    with pytest.raises(texts.TextError, match=r"sentences\.csv, line 2: a NUL byte \(character 10\)"):
        list(texts.read_tatoeba(path))


def test_tatoeba_large_ids_are_checked_for_duplicates_too(tmp_path):
    path = tatoeba_file(tmp_path / "sentences.csv", ["999999999999\teng\ta", "999999999999\teng\tb"])
    with pytest.raises(texts.TextError, match="line 2: sentence id 999999999999 occurs on an earlier line"):
        list(texts.read_tatoeba(path))


# --- UDHR -----------------------------------------------------------------------------------------

def udhr_docs() -> dict[str, bytes]:
    return {
        "udhr_eng.xml": udhr_xml("eng", [("preamble", ["Whereas one.", "Whereas <b>two</b>."]),
                                         ("1", ["Article one."]), ("2", ["", "Second of two."]),
                                         ("list:3", ["Item a.", "Item b."])]),
        # No iso639-3 / iso15924: the language comes from the key, the script from the registry.
        "udhr_deu_1901.xml": udhr_xml("deu_1901", [("1", ["Artikel eins."])], attrs=""),
        "udhr_srp_latn.xml": udhr_xml("srp_latn", [("1", ["Član jedan."])]),
    }


def test_udhr_reader_zip_and_directory(tmp_path):
    docs = udhr_docs()
    archive = tmp_path / "udhr_xml.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("index.xml", "<udhrs/>")  # not a translation: ignored
        for name, data in docs.items():
            z.writestr(name, data)
    directory = tmp_path / "udhr"
    directory.mkdir()
    for name, data in docs.items():
        (directory / name).write_bytes(data)
    stats = texts.SourceStats()
    got = list(texts.read_udhr(archive, stats))
    assert plain(got) == plain(texts.read_udhr(directory))
    assert plain(got) == [
        ("udhr:deu_1901:article-1:1", "udhr", "deu", "Latn", "Artikel eins."),
        ("udhr:eng:preamble:1", "udhr", "eng", "Latn", "Whereas one."),
        ("udhr:eng:preamble:2", "udhr", "eng", "Latn", "Whereas two."),
        ("udhr:eng:article-1:1", "udhr", "eng", "Latn", "Article one."),
        ("udhr:eng:article-2:2", "udhr", "eng", "Latn", "Second of two."),
        ("udhr:eng:article-3:1", "udhr", "eng", "Latn", "Item a."),
        ("udhr:eng:article-3:2", "udhr", "eng", "Latn", "Item b."),
        # Serbian is Cyrillic in the registry; the file says Latin, and the file wins.
        ("udhr:srp_latn:article-1:1", "udhr", "srp", "Latn", "Član jedan."),
    ]
    assert (stats.files, stats.records, stats.empty) == (3, 9, 1)


FRA = udhr_xml("fra", [("1", ["Article premier."])])  # a good neighbour: it is read whatever the odd file


@pytest.mark.parametrize("data, texts_read, what, done", [
    (udhr_xml("eng", [("1", ["x"])], namespace="urn:other"), [("udhr:eng:article-1:1", "Latn", "x")],
     "<udhr> in namespace 'urn:other', not http://www.unhchr.ch/udhr", "read it by element names alone"),
    (udhr_xml("eng", [("1", ["x"])], attrs="iso639-3='English'"), [],
     "iso639-3='English' is not an ISO 639-3 code", "skipped the file"),
    (udhr_xml("EN", [("1", ["x"])], attrs=""), [],
     "no iso639-3 attribute, and the key 'EN' does not begin with a code", "skipped the file"),
    (udhr_xml("eng", [("1", ["x"])], attrs="iso639-3='eng' iso15924='latin'"),
     [("udhr:eng:article-1:1", "Latn", "x")], "iso15924='latin' is not a script code",
     "used the registry's script 'Latn'"),
    (b"<?xml version='1.0'?>\n<udhr xmlns='http://www.unhchr.ch/udhr'>\n<para>x</pra>\n</udhr>\n", [],
     "not well-formed XML at line 3, column", "skipped the file"),
    (b"<?xml version='1.0'?>\n<udhr xmlns='http://www.unhchr.ch/udhr'>\n<para>x\x00</para>\n</udhr>\n", [],
     "a NUL byte at line 3: the file is damaged or not text", "skipped the file"),
    # UTF-16 holds NUL bytes, and reads.
    (udhr_xml("eng", [("1", ["x"])]).decode().replace("UTF-8", "UTF-16").encode("utf-16"),
     [("udhr:eng:article-1:1", "Latn", "x")], None, None),
    (b"<?xml version='1.0'?>\n<html><body>Not found</body></html>\n", [],
     "root element is <html>, not <udhr>", "skipped the file"),
    (udhr_xml("eng", [("1", ["x"]), ("1", ["y"])]),
     [("udhr:eng:article-1:1", "Latn", "x"), ("udhr:eng:article-2:1", "Latn", "y")],
     "article 2 (in document order) is numbered '1'", "keyed by its place: article-2"),
    (udhr_xml("eng", [("1", ["", " "])]), [], "2 empty paragraph(s): article-1 para 1, article-1 para 2",
     "skipped them"),
])
def test_udhr_odd_file_is_read_or_skipped_never_fatal(tmp_path, data, texts_read, what, done):
    (tmp_path / "udhr_eng.xml").write_bytes(data)
    (tmp_path / "udhr_fra.xml").write_bytes(FRA)
    stats = texts.SourceStats()
    got = [(t.id, t.script, t.text) for t in texts.read_udhr(tmp_path, stats)]
    assert got == [*texts_read, ("udhr:fra:article-1:1", "Latn", "Article premier.")]
    mine = [a for a in stats.anomalies if a.file == "udhr_eng.xml"]
    assert any(a.what.startswith(what) and a.done == done and a.source == "udhr" for a in mine) if what \
        else not mine, mine
    assert not [a for a in stats.anomalies if a.file == "udhr_fra.xml"]
    assert stats.files == 2 and stats.skipped_files == (0 if texts_read else 1)


def test_udhr_source_without_translations(tmp_path):
    with pytest.raises(texts.TextError, match=r"no udhr_<key>\.xml files"):
        list(texts.read_udhr(tmp_path))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(texts.TextError, match="not a zip archive"):
        list(texts.read_udhr(tmp_path / "notes.txt"))


def test_udhr_two_files_with_one_key_keep_the_first_in_name_order(tmp_path):
    """Two files claiming key 'eng': the first by name is read, the other skipped, in any archive order."""
    docs = {"udhr_eng.xml": udhr_xml("eng", [("1", ["first"])]),
            "udhr_eng_copy.xml": udhr_xml("eng", [("1", ["second"])])}
    for order in (list(docs), list(reversed(docs))):
        archive = tmp_path / f"{order[0]}.zip"
        with zipfile.ZipFile(archive, "w") as z:
            for name in order:
                z.writestr(name, docs[name])
        stats = texts.SourceStats()
        got = [(t.id, t.text) for t in texts.read_udhr(archive, stats)]
        assert got == [("udhr:eng:article-1:1", "first")]
        assert [(a.file, a.what, a.done) for a in stats.anomalies] == [
            ("udhr_eng_copy.xml", "key='eng' differs from the file name's 'eng_copy'", "used the attribute"),
            ("udhr_eng_copy.xml", "key 'eng' was already read from udhr_eng.xml (files are read in name "
             "order)", "skipped the file")]


# --- registry and requests ------------------------------------------------------------------------

def test_registry_codes_are_well_formed():
    for code, (name, script) in texts.LANGUAGES.items():
        assert texts.LANG_CODE.fullmatch(code) and name
        assert texts.SCRIPT_CODE.fullmatch(script), (code, script)


def sample_sources():
    return {"tatoeba": texts.read_tatoeba(SAMPLE_TATOEBA), "udhr": texts.read_udhr(SAMPLE_UDHR)}


def test_language_asked_for_must_be_registered():
    with pytest.raises(texts.TextError, match=r"--languages: language 'xyz' is not in the language registry "
                                              r"\(LANGUAGES in encoder_study/data/texts\.py\); add it there"):
        selection.select_texts(sample_sources(), {"tatoeba": 3, "udhr": 1}, 0, 400, ["eng", "xyz"])
    with pytest.raises(texts.TextError, match="--languages: language code 'EN' is not well-formed"):
        selection.select_texts(sample_sources(), {"tatoeba": 3, "udhr": 1}, 0, 400, ["EN"])
    with pytest.raises(texts.TextError, match="--languages asks for lao, but no source has an eligible text"):
        selection.select_texts(sample_sources(), {"tatoeba": 3, "udhr": 1}, 0, 400, ["eng", "lao"])


def test_languages_restrict_the_selection():
    chosen = selection.select_texts(sample_sources(), {"tatoeba": 6, "udhr": 2}, 0, 400,
                                    ["eng", "kor"]).records
    assert {r["lang"] for r in chosen} == {"eng", "kor"}
    assert sum(r["source"] == "tatoeba" for r in chosen) == 6


def test_empty_and_short_selections_are_errors():
    with pytest.raises(texts.TextError, match="the selection is empty"):
        selection.select_texts(sample_sources(), {"tatoeba": 0, "udhr": 0}, 0, 400)
    with pytest.raises(texts.TextError, match=r"udhr: asked for 500 texts but only 72 are eligible .*"
                                              r"lower --udhr-count to at most 72"):
        selection.select_texts(sample_sources(), {"tatoeba": 1, "udhr": 500}, 0, 400)


# --- fetching -------------------------------------------------------------------------------------

def test_fetch_file_url_with_good_bad_and_no_hash(tmp_path):
    payload = b"1\teng\tHello.\n" * 1000
    source = tmp_path / "remote dir" / "sentences.csv"
    source.parent.mkdir()
    source.write_bytes(payload)
    url = source.as_uri()  # file:///.../remote%20dir/sentences.csv
    assert "%20" in url

    dest = tmp_path / "got" / "sentences.csv"
    assert fetch.text_source(url, dest, sha(payload), timeout=60) == sha(payload)
    assert dest.read_bytes() == payload
    # Unpinned: the hash is recorded for the caller.
    assert fetch.text_source(url, tmp_path / "unpinned.csv", "", 60) == sha(payload)
    assert fetch.text_source(str(source), tmp_path / "by-path.csv", sha(payload).upper(), 60) == sha(payload)

    dest.write_bytes(b"the previous file")
    wrong = "0" * 64
    with pytest.raises(files.IntegrityError) as info:
        fetch.text_source(url, dest, wrong, timeout=60)
    message = str(info.value)
    assert url in message and f"expected SHA-256 {wrong}" in message and f"actual {sha(payload)}" in message
    assert dest.read_bytes() == b"the previous file"  # a bad download replaces nothing
    assert not list(dest.parent.glob(".*.tmp"))

    with pytest.raises(texts.TextError, match="is not a SHA-256"):
        fetch.text_source(url, dest, "abc", timeout=60)
    with pytest.raises(texts.TextError, match="no such file"):
        fetch.text_source((tmp_path / "missing.csv").as_uri(), dest, "", 60)


def test_fetch_command_writes_file_and_fragment(tmp_path):
    source = tmp_path / "udhr_xml.zip"
    source.write_bytes(b"PK-not-really-a-zip")
    out, frag = tmp_path / "sources" / "udhr_xml.zip", tmp_path / "prov" / "parity" / "parity_fetch-udhr.md"
    assert command("fetch", "--url", source.as_uri(), "--sha256", "", "--out", str(out), "--timeout", "60",
                   "--provenance", str(frag)) == 0
    assert out.read_bytes() == source.read_bytes()
    body = frag.read_text()
    assert f"SHA-256 {sha(source.read_bytes())} (recorded, not pinned" in body
    assert str(out) in body and str(source) in body
    assert command("fetch", "--url", source.as_uri(), "--sha256", "1" * 64, "--out", str(out),
                   "--timeout", "60", "--provenance", str(frag)) == 2


# --- cutting --------------------------------------------------------------------------------------

FAMILY = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # 7 code points, one grapheme
WAVE = "\U0001F44B\U0001F3FD"                                          # hand + skin tone
FLAG = "\U0001F1E8\U0001F1FF"                                          # regional indicators C Z
JAMO = "\u1100\u1161\u11a8"                                            # 각 written as L V T jamo


@pytest.mark.parametrize("tail", [
    FAMILY, WAVE, FLAG, JAMO,
    "e\u0301",                   # base + combining acute
    "o\u0323\u0300",             # Yoruba o + dot below + grave, decomposed
    "\u0915\u094d\u200d\u0937",  # Devanagari ka + virama + ZWJ + ssa: one cluster (Unicode 15.1)
])
def test_cut_never_splits_a_grapheme(tail):
    for start in range(400 - len(tail) + 1, 400):  # every position where the cluster straddles 400
        text = "a" * start + tail + "z"
        out = selection.cut(text, 400)
        assert out == "a" * start, (start, tail)
    fits = "a" * (400 - len(tail)) + tail + "z"
    assert selection.cut(fits, 400) == "a" * (400 - len(tail)) + tail


def test_cut_strips_and_keeps_short_texts():
    inner = "\u200bkeep the zero-width spaces\u200b"
    assert selection.cut(f"  {inner} \n", 400) == inner
    assert selection.cut("abc def", 4) == "abc"  # the cut lands on a space, which goes too
    assert selection.cut("abc", 3) == "abc"


def test_cut_on_the_sample_is_a_grapheme_prefix():
    rng = random.Random(0)
    samples = [*texts.read_udhr(SAMPLE_UDHR), *texts.read_tatoeba(SAMPLE_TATOEBA)]
    for text in (t.text for t in samples):
        clusters = regex.findall(r"\X", text)
        for limit in {rng.randint(1, len(text)) for _ in range(8)} | {400}:
            out = selection.cut(text, limit)
            assert len(out) <= limit and text.startswith(out)
            mine = regex.findall(r"\X", out)
            assert mine == clusters[:len(mine)]


# --- selection ------------------------------------------------------------------------------------

def run_select(tmp_path, name, tatoeba=SAMPLE_TATOEBA, udhr=SAMPLE_UDHR, *extra) -> tuple[int, Path, Path]:
    out = tmp_path / name / "results" / "texts" / "parity_texts.jsonl"
    frag = tmp_path / name / "provenance" / "parity" / "parity_select.md"
    rc = command("select", "--tatoeba", str(tatoeba), "--tatoeba-sha256", "", "--udhr", str(udhr),
                 "--udhr-sha256", "", "--seed", "0", "--tatoeba-count", "150", "--udhr-count", "50",
                 "--max-chars", "400", "--languages", "", "--out", str(out), "--provenance", str(frag),
                 *extra)
    return rc, out, frag


def test_selection_is_deterministic_and_ignores_input_order(tmp_path):
    rc, first, _ = run_select(tmp_path, "a")
    assert rc == 0
    assert run_select(tmp_path, "b")[1].read_bytes() == first.read_bytes()
    other = run_select(tmp_path, "c", SAMPLE_TATOEBA, SAMPLE_UDHR, "--seed", "1")[1]
    assert other.read_bytes() != first.read_bytes()

    # The same sentences in another order, and the UDHR files zipped in reverse order: same records.
    lines = SAMPLE_TATOEBA.read_text(encoding="utf-8").splitlines(keepends=True)
    random.Random(5).shuffle(lines)
    shuffled = tmp_path / "shuffled.tsv"
    shuffled.write_text("".join(lines), encoding="utf-8")
    archive = tmp_path / "udhr_xml.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(SAMPLE_UDHR.glob("*.xml"), reverse=True):
            z.write(p, p.name)
    moved = run_select(tmp_path, "d", shuffled, archive)[1]
    assert moved.read_bytes() == first.read_bytes()


def test_selection_spreads_over_scripts_then_languages():
    tatoeba_scripts = {t.script for t in texts.read_tatoeba(SAMPLE_TATOEBA)}
    tatoeba_langs = {t.lang for t in texts.read_tatoeba(SAMPLE_TATOEBA)}
    for seed in (0, 1, 2):
        counts = {"tatoeba": len(tatoeba_scripts), "udhr": 0}
        few = selection.select_texts(sample_sources(), counts, seed, 400)
        assert {r["script"] for r in few.records} == tatoeba_scripts  # one text per script first
        counts = {"tatoeba": len(tatoeba_langs), "udhr": 21}
        one_each = selection.select_texts(sample_sources(), counts, seed, 400)
        tat = [r for r in one_each.records if r["source"] == "tatoeba"]
        assert sorted(r["lang"] for r in tat) == sorted(tatoeba_langs)  # then one per language
        groups = [(r["lang"], r["script"]) for r in one_each.records if r["source"] == "udhr"]
        assert len(set(groups)) == 21  # srp in Cyrillic and srp in Latin are separate groups
    ids = {s: [r["id"] for r in selection.select_texts(sample_sources(), {"tatoeba": 150, "udhr": 50}, s,
                                                   400).records] for s in (0, 1)}
    assert len(set(ids[0])) == 200 and ids[0] != ids[1]


def test_command_end_to_end_on_the_sample(tmp_path, capsys):
    rc, out, frag = run_select(tmp_path, "run")
    assert rc == 0
    raw = out.read_text(encoding="utf-8")
    records = [json.loads(line) for line in raw.splitlines()]
    assert len(records) == 200
    assert sum(r["source"] == "tatoeba" for r in records) == 150
    assert sum(r["source"] == "udhr" for r in records) == 50
    for r in records:
        assert set(r) == {"id", "source", "lang", "script", "text", "chars", "truncated"}
        assert 0 < len(r["text"]) == r["chars"] <= 400 and r["text"] == r["text"].strip()
    assert any(r["truncated"] for r in records)
    assert "\\u" not in raw  # ensure_ascii=False: the texts are readable in the file
    assert raw.splitlines() == [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in records]
    keys = [(r["source"], r["lang"], r["script"], selection.natural_key(r["id"])) for r in records]
    assert keys == sorted(keys)
    assert len({r["lang"] for r in records}) >= 40 and len({r["script"] for r in records}) >= 20

    body = frag.read_text(encoding="utf-8")
    assert "## Texts per language and script" in body and "## Texts per script" in body
    assert "| kor | Korean | Kore |" in body
    assert "chosen with seed 0" in body
    tatoeba_sha = files.sha256_file(SAMPLE_TATOEBA)
    assert f"tatoeba source SHA-256 {tatoeba_sha} (recorded, not pinned" in body
    assert f"udhr source SHA-256 {files.tree_sha256(SAMPLE_UDHR)} (recorded, not pinned" in body
    assert f"| input | {SAMPLE_TATOEBA.as_posix()} |" in body
    assert f"| output | {out.as_posix()} |" in body
    assert "1 without a language (\\N)" in body

    # Pinned hashes are checked; a wrong one stops the command before anything is written.
    pinned = run_select(tmp_path, "pinned", SAMPLE_TATOEBA, SAMPLE_UDHR, "--tatoeba-sha256", tatoeba_sha,
                        "--udhr-sha256", files.tree_sha256(SAMPLE_UDHR))
    assert pinned[0] == 0 and pinned[1].read_bytes() == out.read_bytes()
    assert f"tatoeba source SHA-256 {tatoeba_sha} (pinned and checked)" in pinned[2].read_text()
    capsys.readouterr()
    wrong = "f" * 64
    rc, bad_out, bad_frag = run_select(tmp_path, "bad", SAMPLE_TATOEBA, SAMPLE_UDHR,
                                       "--tatoeba-sha256", wrong)
    err = capsys.readouterr().err
    assert rc == 2 and not bad_out.exists() and not bad_frag.exists()
    assert (f"tatoeba source {SAMPLE_TATOEBA} does not match: expected SHA-256 {wrong}, "
            f"actual {tatoeba_sha}") in err


def test_command_accepts_select_subcommand_and_file_urls(tmp_path):
    rc, first, _ = run_select(tmp_path, "plain")
    out = tmp_path / "sub" / "parity_texts.jsonl"
    frag = tmp_path / "sub" / "parity" / "parity_select.md"
    settings = ["--tatoeba-sha256", "", "--udhr-sha256", "", "--seed", "0", "--tatoeba-count", "150",
                "--udhr-count", "50", "--max-chars", "400", "--languages", ""]
    assert command("select", "--tatoeba", SAMPLE_TATOEBA.as_uri(), "--udhr", SAMPLE_UDHR.as_uri(), *settings,
                   "--out", str(out), "--provenance", str(frag)) == 0
    assert out.read_bytes() == first.read_bytes()  # file:// URLs read the same files as paths
    assert command("select", "--tatoeba", "https://example.org/sentences.tar.bz2", "--udhr", str(SAMPLE_UDHR),
                   *settings, "--out", str(out), "--provenance", str(tmp_path / "p" / "x.md")) == 2


# --- the committed sample -------------------------------------------------------------------------

def test_sample_covers_many_languages_scripts_and_hard_characters():
    sentences = list(texts.read_tatoeba(SAMPLE_TATOEBA))
    paragraphs = list(texts.read_udhr(SAMPLE_UDHR))
    every = sentences + paragraphs
    assert all(t.lang in texts.LANGUAGES for t in every)
    assert len({t.lang for t in sentences}) >= 40 and len({t.script for t in sentences}) >= 20
    assert len(sentences) >= 150 and len(paragraphs) >= 50
    joined = "".join(t.text for t in every)
    for char in ("\u200d", "\u200c", "\u200b"):  # ZWJ, ZWNJ, zero-width space
        assert char in joined
    assert any(0x1F3FB <= ord(c) <= 0x1F3FF for c in joined)  # skin-tone modifiers
    assert any(unicodedata.combining(c) for c in joined)
    assert any("\u1100" <= c <= "\u11ff" for c in joined)  # Hangul written in jamo
    assert sum(len(t.text) > 400 for t in paragraphs) >= 5
    assert all(t.script == texts.LANGUAGES[t.lang][1] for t in sentences)


def test_sample_files_are_what_the_readers_expect():
    """The sample is in the real formats: three fields a line, UDHR namespace and attributes."""
    for line in SAMPLE_TATOEBA.read_text(encoding="utf-8").splitlines():
        assert line.count("\t") == 2
    for path in sorted(SAMPLE_UDHR.glob("*.xml")):
        head = path.read_text(encoding="utf-8")[:400]
        assert f"xmlns='{texts.UDHR_NS}'" in head and "xml:lang=" in head and " n=" in head
        assert f"key='{path.stem[len('udhr_'):]}'" in head
