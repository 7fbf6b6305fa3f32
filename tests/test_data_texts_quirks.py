"""The text readers on the quirks of the real assemblies, and a seeded fuzz of odd but well-formed input.

Each fixture reproduces a quirk seen in the real sources, in their real layout (double-quoted
attributes, a copyright comment, a root <note>): the UDHR assembly's udhr_shk.xml numbers its 29th
article "2"; udhr_007.xml and its kind carry iso639-3='und'; some translations are unfinished
(empty paragraphs); Tatoeba's export marks unknown languages `\\N`, and an old Tatoeba bug left an
empty language field on some sentences. The texts are made up here, not copied from the sources.
"""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest

from conftest import cli_runner
from encoder_study.data import texts
from encoder_study.recipes.parity import selection

NS = texts.UDHR_NS


def real_layout(key: str, lang: str, articles: list[tuple[str | None, list[str] | list[list[str]]]],
                preamble: list[str] | None = None, script: str | None = "Latn") -> bytes:
    """A UDHR file laid out as the assembly's are. An article is (number or None for no attribute,
    paragraphs), where a list of lists is an <orderedlist> of items."""
    script_attr = f" iso15924='{script}'" if script else ""
    out = ['<?xml version="1.0" encoding="UTF-8"?>\n\n<!--© made up for the tests-->\n\n',
           f"<udhr iso639-3='{lang}' xml:lang='{lang}' key='{key}' n='Test'{script_attr} xmlns=\"{NS}\">\n",
           "   <title>Universal Declaration</title>\n   <note>\n     <para>G.A. res. 217A (III)</para>\n"
           "   </note>\n"]
    if preamble is not None:
        out.append("   <preamble>\n      <title>Preamble</title>\n")
        out += [f"      <para>{escape(p)}</para>\n" for p in preamble]
        out.append("   </preamble>\n")
    for k, (number, paras) in enumerate(articles, 1):
        attr = "" if number is None else f' number="{number}"'
        out.append(f"   <article{attr}>\n      <title>Article {k}</title>\n")
        if paras and isinstance(paras[0], list):
            out.append("      <orderedlist>\n")
            for item in paras:
                out.append("         <listitem>\n")
                out += [f"            <para>{escape(p)}</para>\n" for p in item]
                out.append("         </listitem>\n")
            out.append("      </orderedlist>\n")
        else:
            out += [f"      <para>{escape(p)}</para>\n" for p in paras]
        out.append("   </article>\n")
    out.append("</udhr>\n\n")
    return "".join(out).encode("utf-8")


def shilluk_like() -> bytes:
    """30 articles, the 29th numbered "2" (as udhr_shk.xml), 29 with a list of three clauses."""
    articles: list = [(str(k), [f"shk article {k}."]) for k in range(1, 29)]
    articles.append(("2", [["shk 29 clause 1."], ["shk 29 clause 2."], ["shk 29 clause 3."]]))
    articles.append(("30", ["shk article 30."]))
    return real_layout("shk", "shk", articles, preamble=["shk preamble 1.", "shk preamble 2."])


def assembly(directory: Path) -> Path:
    """A small assembly with every known UDHR quirk next to ordinary files."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "udhr_shk.xml": shilluk_like(),
        # No number attribute on the second article (a file may spell the attribute wrongly).
        "udhr_kjh.xml": real_layout("kjh", "kjh", [("1", ["kjh one."]), (None, ["kjh two."])], script="Cyrl"),
        # iso639-3='und': read, then not eligible (no registered language, no script).
        "udhr_007.xml": real_layout("007", "und", [("1", ["und one."])], script=None),
        # An unfinished translation: paragraphs left empty.
        "udhr_eng.xml": real_layout("eng", "eng", [("1", ["All are born free."]), ("2", ["", "Second."]),
                                                   ("3", [[""], ["Item two."]])], preamble=["Whereas."]),
        "udhr_fra.xml": real_layout("fra", "fra", [("1", ["Tous naissent libres."])]),
        # Nothing but empty paragraphs: nothing to read.
        "udhr_deu.xml": real_layout("deu", "deu", [("1", [""]), ("2", ["  "])]),
        # Cut off in the middle of a download.
        "udhr_ita.xml": real_layout("ita", "ita", [("1", ["Tutti nascono liberi."])])[:120],
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def by_file(stats: texts.SourceStats) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for a in stats.anomalies:
        out.setdefault(a.file, []).append((a.what, a.done))
    return out


# --- the UDHR quirks ------------------------------------------------------------------------------

def test_shilluk_article_numbered_2_is_keyed_by_its_place(tmp_path):
    (tmp_path / "udhr_shk.xml").write_bytes(shilluk_like())
    stats = texts.SourceStats()
    got = list(texts.read_udhr(tmp_path, stats))
    ids = [t.id for t in got]
    assert len(ids) == len(set(ids)) == 2 + 28 + 3 + 1
    assert ids[:3] == ["udhr:shk:preamble:1", "udhr:shk:preamble:2", "udhr:shk:article-1:1"]
    art = {t.id: t.text for t in got}
    assert art["udhr:shk:article-2:1"] == "shk article 2."  # the real article 2 keeps its key
    assert [art[f"udhr:shk:article-29:{i}"] for i in (1, 2, 3)] == [f"shk 29 clause {i}." for i in (1, 2, 3)]
    assert art["udhr:shk:article-30:1"] == "shk article 30."
    assert "G.A. res. 217A (III)" not in art.values()  # the root <note> is not text
    assert "(article-29)" in got[-4].where and "number='2'" in got[-4].where
    assert by_file(stats) == {"udhr_shk.xml": [("article 29 (in document order) is numbered '2'",
                                                "keyed by its place: article-29")]}


def test_assembly_with_every_quirk_is_read_and_each_anomaly_recorded(tmp_path):
    stats = texts.SourceStats()
    got = {t.id: (t.lang, t.script, t.text) for t in texts.read_udhr(assembly(tmp_path / "udhr"), stats)}
    assert got["udhr:kjh:article-2:1"] == ("kjh", "Cyrl", "kjh two.")
    assert got["udhr:007:article-1:1"] == ("und", None, "und one.")
    assert got["udhr:eng:article-2:2"] == ("eng", "Latn", "Second.")  # keeps its place after an empty one
    assert got["udhr:eng:article-3:2"] == ("eng", "Latn", "Item two.")
    assert "udhr:eng:article-2:1" not in got and not any(i.startswith(("udhr:deu", "udhr:ita")) for i in got)
    odd = by_file(stats)
    assert odd["udhr_kjh.xml"] == [("article 2 (in document order) has no number attribute",
                                    "keyed by its place: article-2")]
    assert odd["udhr_eng.xml"] == [("2 empty paragraph(s): article-2 para 1, article-3 para 1",
                                    "skipped them")]
    assert odd["udhr_deu.xml"] == [
        ("2 empty paragraph(s): article-1 para 1, article-2 para 1", "skipped them"),
        ("no non-empty paragraph in a <preamble> or <article>", "skipped the file")]
    (what, done), = odd["udhr_ita.xml"]
    assert what.startswith("not well-formed XML at line") and done == "skipped the file"
    assert "udhr_fra.xml" not in odd and "udhr_007.xml" not in odd
    assert (stats.files, stats.skipped_files, stats.empty) == (7, 2, 4)


def test_other_namespaces_no_namespace_prefixes_and_odd_structure(tmp_path):
    body = ("<{p}preamble><{p}recital number='1'><{p}para>Recital.</{p}para></{p}recital>"
            "<{p}proclamation><{p}para>Proclaims.</{p}para></{p}proclamation></{p}preamble>"
            "<{p}article number='1'>"                                      # no title
            "<{p}para>One <{p}b>bold</{p}b> &amp; <![CDATA[<raw>]]><!-- c --><?pi x?>text.</{p}para>"
            "<{p}note><{p}para>An editor's note.</{p}para></{p}note>"
            "<{p}orderedlist><{p}listitem><{p}para>Outer.</{p}para><{p}orderedlist><{p}listitem>"
            "<{p}para>Nested.</{p}para></{p}listitem></{p}orderedlist></{p}listitem></{p}orderedlist>"
            "<{p}para>Outer para <{p}para>inner</{p}para> end.</{p}para>"
            "</{p}article>")
    variants = {
        "udhr_aaa.xml": f"<udhr key='eng' iso639-3='eng'>{body.format(p='')}</udhr>",
        "udhr_bbb.xml": f"<udhr xmlns='urn:x-other' key='fra' iso639-3='fra'>{body.format(p='')}</udhr>",
        "udhr_ccc.xml": (f"<u:udhr xmlns:u='{NS}' key='deu' iso639-3='deu'>{body.format(p='u:')}</u:udhr>"),
    }
    for name, xml in variants.items():
        (tmp_path / name).write_text(xml, encoding="utf-8")
    stats = texts.SourceStats()
    got = [(t.id, t.text) for t in texts.read_udhr(tmp_path, stats)]
    expected = ["Recital.", "Proclaims.", "One bold & <raw>text.", "Outer.", "Nested.",
                "Outer para inner end."]
    for key in ("eng", "fra", "deu"):
        mine = [(i, x) for i, x in got if i.startswith(f"udhr:{key}:")]
        assert [x for _, x in mine] == expected
        assert [i for i, _ in mine] == [f"udhr:{key}:preamble:1", f"udhr:{key}:preamble:2",
                                        *(f"udhr:{key}:article-1:{n}" for n in (1, 2, 3, 4))]
    odd = by_file(stats)
    assert odd["udhr_aaa.xml"][0] == (f"<udhr> in no namespace, not {NS}", "read it by element names alone")
    assert odd["udhr_bbb.xml"][0] == (f"<udhr> in namespace 'urn:x-other', not {NS}",
                                      "read it by element names alone")
    assert all(w.startswith("key=") for w, _ in odd["udhr_ccc.xml"])  # only its key differs from the name


@pytest.mark.parametrize("xml, what", [
    (b"", "not well-formed XML at line 1"),
    (b"\xff\xfe<udhr/>", "not well-formed XML"),
    (f"<udhr xmlns='{NS}' key='eng' iso639-3='eng'><title>Only a title</title></udhr>".encode(),
     "no non-empty paragraph"),
    (f"<udhr xmlns='{NS}' key='a:b' iso639-3='eng'><article><para>x</para></article></udhr>".encode(),
     None),
    (f"<udhr xmlns='{NS}' key='eng' iso639-3=' eng '><article><para>x</para></article></udhr>".encode(),
     None),
    (f"<udhr xmlns='{NS}' key='123' ><article><para>x</para></article></udhr>".encode(),
     "no iso639-3 attribute, and the key '123' does not begin with a code"),
])
def test_unreadable_files_are_skipped_with_a_reason(tmp_path, xml, what):
    (tmp_path / "udhr_eng.xml").write_bytes(xml)
    stats = texts.SourceStats()
    got = list(texts.read_udhr(tmp_path, stats))
    if what is None:  # odd but readable: a colon in the key falls back to the file name's key
        assert [t.id for t in got] == ["udhr:eng:article-1:1"] and got[0].lang == "eng"
        return
    assert got == [] and stats.skipped_files == 1
    assert any(a.what.startswith(what) and a.done == "skipped the file" for a in stats.anomalies), \
        stats.anomalies


def test_a_member_that_cannot_be_read_skips_only_itself(tmp_path):
    archive = tmp_path / "udhr_xml.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("udhr_eng.xml", real_layout("eng", "eng", [("1", ["One."])]))
        z.writestr("udhr_fra.xml", real_layout("fra", "fra", [("1", ["Un."])]))
    data = bytearray(archive.read_bytes())
    at = data.index(b"udhr_fra.xml") + len(b"udhr_fra.xml") + 5  # inside fra's compressed data
    data[at] ^= 0xFF
    archive.write_bytes(bytes(data))
    stats = texts.SourceStats()
    assert [t.id for t in texts.read_udhr(archive, stats)] == ["udhr:eng:article-1:1"]
    (anomaly,) = stats.anomalies
    assert anomaly.file == "udhr_fra.xml" and anomaly.what.startswith("could not be read")


# --- Tatoeba's unknown languages ------------------------------------------------------------------

def test_tatoeba_unknown_languages_are_skipped_and_counted(tmp_path):
    path = tmp_path / "sentences.csv"
    path.write_text("1\teng\tHello.\n2\t\\N\tWho knows.\n3\t\tEmpty field.\n4\t\\N\tAgain.\n"
                    "5\tcycl\t(#$isa #$Cat #$Animal)\n6\tfra\tBonjour.\n", encoding="utf-8")
    stats = texts.SourceStats()
    assert [t.id for t in texts.read_tatoeba(path, stats)] == ["tatoeba:1", "tatoeba:6"]
    assert (stats.records, stats.no_language, stats.empty_language, stats.not_iso) == (6, 2, 1, 1)
    assert [(a.file, a.what, a.done) for a in stats.anomalies] == [
        ("sentences.csv", "2 sentence(s) with language \\N (unknown)", "skipped deliberately, counted"),
        ("sentences.csv", "1 sentence(s) with an empty language field (an old Tatoeba bug; means \\N)",
         "skipped deliberately, counted"),
        ("sentences.csv", "1 sentence(s) with a code that names no natural language (cycl)",
         "skipped deliberately, counted")]


# --- the command: fragment and determinism on a quirky assembly -----------------------------------

def select(tmp_path: Path, name: str, tatoeba: Path, udhr: Path) -> tuple[Path, str]:
    out = tmp_path / name / "parity_texts.jsonl"
    frag = tmp_path / name / "parity_select.md"
    rc = cli_runner("parity")("select", "--tatoeba", str(tatoeba), "--tatoeba-sha256", "", "--udhr",
                              str(udhr), "--udhr-sha256", "", "--seed", "3", "--tatoeba-count", "2",
                              "--udhr-count", "5", "--max-chars", "400", "--languages", "", "--out", str(out),
                              "--provenance", str(frag))
    assert rc == 0
    return out, frag.read_text(encoding="utf-8")


def anomaly_section(body: str) -> str:
    start = body.index("## Source anomalies")
    end = body.index("\n## ", start + 1)
    return body[start:end]


def test_select_on_a_quirky_assembly_lists_anomalies_and_ignores_order(tmp_path):
    tatoeba = tmp_path / "sentences.csv"
    lines = ["1\teng\tHello.", "2\t\\N\tWho knows.", "3\tfra\tBonjour.", "4\t\tEmpty.", "5\tdeu\tHallo."]
    tatoeba.write_text("\n".join(lines) + "\n", encoding="utf-8")
    directory = assembly(tmp_path / "udhr")
    out, body = select(tmp_path, "dir", tatoeba, directory)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 7
    # shk, kjh and und are not in the registry: read, and not eligible.
    assert {r["lang"] for r in records if r["source"] == "udhr"} == {"eng", "fra"}
    section = anomaly_section(body)
    assert "| source | file | what was odd | what was done |" in section
    for row in (
            "| udhr | udhr_ita.xml | not well-formed XML at line 5, column 0 (unclosed token) | skipped the "
            "file |",
            "| udhr | udhr_shk.xml | article 29 (in document order) is numbered '2' | keyed by its place: "
            "article-29 |",
            "| udhr | udhr_kjh.xml | article 2 (in document order) has no number attribute |",
            "| udhr | udhr_deu.xml | no non-empty paragraph in a <preamble> or <article> | skipped the "
            "file |",
            "| tatoeba | sentences.csv | 1 sentence(s) with language \\N (unknown) | skipped deliberately, "
            "counted |",
            "| tatoeba | sentences.csv | 1 sentence(s) with an empty language field"):
        assert row in section, row
    assert "udhr: 46 records in 7 file(s); 2 file(s) skipped; 4 empty paragraphs skipped" in body
    assert "tatoeba: 5 records in 1 file(s); 1 without a language (\\N), skipped; 1 with an empty language " \
           "field, skipped" in body

    # The same files zipped in another order, and the lines shuffled: the same records and anomalies.
    archive = tmp_path / "udhr_xml.zip"
    names = sorted(p.name for p in directory.iterdir())
    random.Random(1).shuffle(names)
    with zipfile.ZipFile(archive, "w") as z:
        for n in names:
            z.write(directory / n, n)
    random.Random(2).shuffle(lines)
    shuffled = tmp_path / "shuffled.csv"
    shuffled.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out2, body2 = select(tmp_path, "zip", shuffled, archive)
    assert out2.read_bytes() == out.read_bytes()
    assert anomaly_section(body2).replace("shuffled.csv", "sentences.csv") == section


def test_registered_shilluk_is_selected_with_the_place_key(tmp_path, monkeypatch):
    """With Shilluk in the registry, its 29th article can be chosen, under the key article-29."""
    monkeypatch.setitem(texts.LANGUAGES, "shk", ("Shilluk", "Latn"))
    (tmp_path / "udhr_shk.xml").write_bytes(shilluk_like())
    chosen = selection.select_texts({"udhr": texts.read_udhr(tmp_path)}, {"udhr": 34}, 0, 400,
                                    ["shk"]).records
    ids = {r["id"] for r in chosen}
    assert len(ids) == 34
    assert {"udhr:shk:article-29:1", "udhr:shk:article-29:3", "udhr:shk:article-2:1"} <= ids


# --- fuzz: odd but well-formed XML and TSV --------------------------------------------------------

ALPHABET = "abcxyz ÀéøØ\u0301\u200dЖ中ﻻ&<>\"'.,;-" + "\u05d0\U0001F44B"
NAMESPACES = (NS, "", "urn:x-other", "http://example.org/udhr")


def words(rng: random.Random, empty: float = 0.0) -> str:
    if rng.random() < empty:
        return rng.choice(["", " ", "\n  "])
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))) + rng.choice(["", ".", " x"])


class FuzzDoc:
    """A random, well-formed UDHR document and what a correct reader must make of it."""

    def __init__(self, rng: random.Random, key: str):
        self.key, self.rng = key, rng
        self.expected: list[tuple[str, str]] = []    # (id, text) in document order
        self.renumbered: list[int] = []              # articles whose number is off or missing
        self.empty = 0
        ns = rng.choice(NAMESPACES)
        prefix = rng.choice(["", "u:"]) if ns else ""
        self.p = prefix
        decl = (f" xmlns:u={quoteattr(ns)}" if prefix else f" xmlns={quoteattr(ns)}") if ns else ""
        lang_attr = rng.choice([" iso639-3='eng'", ""])  # without it, the language comes from the key
        out = [f"<?xml version='1.0' encoding='UTF-8'?>\n<!-- fuzz -->\n<{prefix}udhr{decl} key='{key}' "
               f"n='Fuzz' xml:lang='en'{lang_attr}>"]
        if rng.random() < 0.7:
            out.append(self.el("title", escape(words(rng))))
        if rng.random() < 0.4:
            out.append(self.el("note", self.el("para", escape(words(rng)))))  # never text
        sections = ["preamble"] * rng.choice([0, 1, 1]) + ["article"] * rng.randint(0, 8)
        rng.shuffle(sections)  # a preamble after some articles is odd, and still read in order
        articles = 0
        for section in sections:
            if section == "preamble":
                out.append(self.section("preamble", "preamble", ""))
            else:
                articles += 1
                number = rng.choice([str(articles)] * 4 + [str(max(1, articles - 1)), "2", " 7 ", "II", None])
                if number is None or number.strip() != str(articles):
                    self.renumbered.append(articles)
                attr = "" if number is None else f" number={quoteattr(number)}"
                out.append(self.section("article", f"article-{articles}", attr))
        out.append(f"</{prefix}udhr>")
        self.xml = "\n".join(out).encode("utf-8")

    def el(self, name: str, inner: str, attrs: str = "") -> str:
        return f"<{self.p}{name}{attrs}>{inner}</{self.p}{name}>"

    def para(self, section: str, index: list[int]) -> str:
        rng = self.rng
        text = words(rng, empty=0.15)
        index[0] += 1
        if text.strip():
            self.expected.append((f"udhr:{self.key}:{section}:{index[0]}", text.strip()))
        else:
            self.empty += 1
        # Inline markup, a comment or CDATA inside a paragraph leave its text as it is.
        head, tail = text[: len(text) // 2], text[len(text) // 2:]
        inner = rng.choice([escape(text), escape(head) + "<!-- c -->" + escape(tail),
                            escape(head) + self.el("span", escape(tail)),
                            escape(head) + f"<![CDATA[{tail}]]>" if "]]>" not in tail else escape(text)])
        return self.el("para", inner)

    def block(self, section: str, index: list[int], depth: int) -> str:
        rng = self.rng
        parts = []
        for _ in range(rng.randint(0, 3)):
            roll = rng.random()
            if roll < 0.55 or depth >= 3:
                parts.append(self.para(section, index))
            elif roll < 0.85:  # a list, its items holding paragraphs and maybe lists again
                items = [self.el("listitem", self.block(section, index, depth + 1), f" tag='{i}.'")
                         for i in range(rng.randint(1, 3))]
                parts.append(self.el("orderedlist", "".join(items)))
            else:
                parts.append(self.el("note", self.el("para", escape(words(rng)))))
        return "".join(parts)

    def section(self, name: str, section: str, attrs: str) -> str:
        title = self.el("title", escape(words(self.rng))) if self.rng.random() < 0.6 else ""
        return self.el(name, title + self.block(section, [0], 0), attrs)


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_udhr_reader_reads_well_formed_documents_in_order(tmp_path, seed):
    rng = random.Random(seed)
    docs = {f"eng_{i:02d}": FuzzDoc(rng, f"eng_{i:02d}") for i in range(40)}
    directory = tmp_path / "udhr"
    directory.mkdir()
    for key, doc in docs.items():
        (directory / f"udhr_{key}.xml").write_bytes(doc.xml)
    # The generator did make the quirks this test is about.
    assert sum(len(d.renumbered) for d in docs.values()) >= 10
    assert sum(d.empty for d in docs.values()) >= 10
    assert any(not d.expected for d in docs.values())
    assert sum(len(d.expected) > 3 for d in docs.values()) >= 10
    assert {b"xmlns='urn:x-other'" in d.xml or b"xmlns:u=" in d.xml for d in docs.values()} == {True, False}
    stats = texts.SourceStats()
    got = [(t.id, t.text) for t in texts.read_udhr(directory, stats)]  # never raises
    assert got == [pair for key in sorted(docs) for pair in docs[key].expected]  # document order
    odd = by_file(stats)
    for key, doc in docs.items():
        mine = odd.get(f"udhr_{key}.xml", [])
        numbered = sorted(int(w.split()[1]) for w, _ in mine if w.startswith("article "))
        assert numbered == doc.renumbered, (key, mine)
        assert any(w.startswith(f"{doc.empty} empty paragraph(s)") for w, _ in mine) == (doc.empty > 0)
        assert any(d == "skipped the file" for _, d in mine) == (not doc.expected)
    assert stats.empty == sum(d.empty for d in docs.values())
    assert stats.skipped_files == sum(not d.expected for d in docs.values())

    archive = tmp_path / "udhr_xml.zip"
    names = [f"udhr_{k}.xml" for k in docs]
    rng.shuffle(names)
    with zipfile.ZipFile(archive, "w") as z:
        for n in names:
            z.write(directory / n, n)
    zipped = texts.SourceStats()
    assert [(t.id, t.text) for t in texts.read_udhr(archive, zipped)] == got  # order of the archive: none
    assert zipped.anomalies == stats.anomalies


def mysql_escape(text: str, rng: random.Random) -> str:
    """What `SELECT ... INTO OUTFILE` writes: a backslash before a backslash, tab or newline (tab and
    newline also as the letters t and n, which LOAD DATA reads the same)."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c in "\t\n":
            out.append("\\" + (c if rng.random() < 0.5 else {"\t": "t", "\n": "n"}[c]))
        else:
            out.append(c)
    return "".join(out)


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_tatoeba_reader_reads_well_formed_exports(tmp_path, seed):
    rng = random.Random(seed)
    codes = ["eng", "fra", "cmn", "zzz", "\\N", "\\N", "", "cycl"]
    ids = rng.sample(range(1, 10**9), 300)
    lines, expected = [], []
    counts = {"\\N": 0, "": 0, "cycl": 0}
    for sid in ids:
        code = rng.choice(codes)
        text = "".join(rng.choice("ab Ж中\\\tN\n") for _ in range(rng.randint(0, 12))) + rng.choice("xyz")
        lines.append(f"{sid}\t{code}\t{mysql_escape(text, rng)}")
        if code in counts:
            counts[code] += 1
        else:
            expected.append((f"tatoeba:{sid}", code, text.strip()))
    path = tmp_path / "sentences.csv"
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    stats = texts.SourceStats()
    got = [(t.id, t.lang, t.text) for t in texts.read_tatoeba(path, stats)]  # never raises
    assert got == expected
    assert (stats.records, stats.no_language, stats.empty_language, stats.not_iso) == (
        300, counts["\\N"], counts[""], counts["cycl"])
    assert len(stats.anomalies) == sum(1 for n in counts.values() if n)
