"""The multilingual texts: Tatoeba sentences and UDHR paragraphs, read from their real formats.

Sources, read with the standard library:

- Tatoeba's weekly export `sentences.csv` (inside https://downloads.tatoeba.org/exports/sentences.tar.bz2,
  or extracted). MySQL writes it with `SELECT ... INTO OUTFILE`: one sentence a line, three fields
  separated by tabs (sentence id, ISO 639-3 code or `\\N` for none, text); a backslash escapes a
  tab, a newline or a backslash inside the text, and `\\N` alone is NULL. Sentences of unknown
  language (`\\N`, or an empty field, which an old Tatoeba bug left for some) are skipped on purpose
  and counted; so are those in `TATOEBA_NOT_ISO`. A line that breaks the format raises TextError.
- The UDHR in XML (https://unicode.org/udhr/assemblies/udhr_xml.zip): one `udhr_<key>.xml` per
  translation, root `udhr` in namespace http://www.unhchr.ch/udhr with attributes `key`, `n` (the
  name), `xml:lang`, and usually `iso639-3` and `iso15924`. Paragraphs are the `para` elements of
  the `preamble` and of each `article` (also those in lists, nested or not); titles and notes are
  not text. A paragraph is keyed by its place: `udhr:<key>:article-<k>:<i>` is the i-th paragraph
  of the k-th article in document order, whatever number the article prints (the real udhr_shk.xml
  numbers its 29th article "2"), and an article without a `number` attribute is keyed the same way.
  Real files are messy, and no single file stops the selection: one that cannot be read (not
  well-formed, no usable key or language, a key an earlier file in name order has, no text) is
  skipped; one that is odd but readable (an article numbered out of place, another namespace or
  none, empty paragraphs, a bad script code) is read. Every such anomaly (file, what was odd, what
  was done) goes into the `parity select` fragment's table "Source anomalies".

The parity recipe's selection of these texts is `data.selection`; the student reads them too, so the
selection lives apart (a change to it re-distils nothing).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import xml.etree.ElementTree as ET
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import regex

from ..core import files
from ..core.errors import UserError

UDHR_NS = "http://www.unhchr.ch/udhr"
SOURCES = ("tatoeba", "udhr")

# ISO 639-3 code -> (English name, main ISO 15924 script). Languages that Tatoeba writes in several
# scripts (Serbian, Mandarin, Uzbek, ...) get the main one; UDHR files name their own script.
LANGUAGES: dict[str, tuple[str, str]] = {
    # Latin
    "afr": ("Afrikaans", "Latn"), "aze": ("Azerbaijani", "Latn"), "bos": ("Bosnian", "Latn"),
    "bre": ("Breton", "Latn"), "cat": ("Catalan", "Latn"), "ceb": ("Cebuano", "Latn"),
    "ces": ("Czech", "Latn"), "cym": ("Welsh", "Latn"), "dan": ("Danish", "Latn"),
    "deu": ("German", "Latn"), "eng": ("English", "Latn"), "epo": ("Esperanto", "Latn"),
    "est": ("Estonian", "Latn"), "eus": ("Basque", "Latn"), "fao": ("Faroese", "Latn"),
    "fin": ("Finnish", "Latn"), "fra": ("French", "Latn"), "fry": ("Western Frisian", "Latn"),
    "gla": ("Scottish Gaelic", "Latn"), "gle": ("Irish", "Latn"), "glg": ("Galician", "Latn"),
    "hat": ("Haitian Creole", "Latn"), "hau": ("Hausa", "Latn"), "hrv": ("Croatian", "Latn"),
    "hun": ("Hungarian", "Latn"), "ibo": ("Igbo", "Latn"), "ind": ("Indonesian", "Latn"),
    "isl": ("Icelandic", "Latn"), "ita": ("Italian", "Latn"), "jav": ("Javanese", "Latn"),
    "kmr": ("Northern Kurdish", "Latn"), "lat": ("Latin", "Latn"), "lav": ("Latvian", "Latn"),
    "lit": ("Lithuanian", "Latn"), "ltz": ("Luxembourgish", "Latn"), "lvs": ("Standard Latvian", "Latn"),
    "mlt": ("Maltese", "Latn"), "mri": ("Maori", "Latn"), "msa": ("Malay", "Latn"),
    "nld": ("Dutch", "Latn"), "nno": ("Norwegian Nynorsk", "Latn"), "nob": ("Norwegian Bokmål", "Latn"),
    "nor": ("Norwegian", "Latn"), "oci": ("Occitan", "Latn"), "pol": ("Polish", "Latn"),
    "por": ("Portuguese", "Latn"), "que": ("Quechua", "Latn"), "ron": ("Romanian", "Latn"),
    "slk": ("Slovak", "Latn"), "slv": ("Slovenian", "Latn"), "som": ("Somali", "Latn"),
    "spa": ("Spanish", "Latn"), "sqi": ("Albanian", "Latn"), "swa": ("Swahili", "Latn"),
    "swe": ("Swedish", "Latn"), "swh": ("Swahili (individual language)", "Latn"),
    "tgl": ("Tagalog", "Latn"), "tuk": ("Turkmen", "Latn"), "tur": ("Turkish", "Latn"),
    "uzb": ("Uzbek", "Latn"), "vie": ("Vietnamese", "Latn"), "xho": ("Xhosa", "Latn"),
    "yor": ("Yoruba", "Latn"), "zsm": ("Standard Malay", "Latn"), "zul": ("Zulu", "Latn"),
    # Cyrillic
    "bak": ("Bashkir", "Cyrl"), "bel": ("Belarusian", "Cyrl"), "bul": ("Bulgarian", "Cyrl"),
    "chv": ("Chuvash", "Cyrl"), "kaz": ("Kazakh", "Cyrl"), "kir": ("Kyrgyz", "Cyrl"),
    "mkd": ("Macedonian", "Cyrl"), "mon": ("Mongolian", "Cyrl"), "rus": ("Russian", "Cyrl"),
    "srp": ("Serbian", "Cyrl"), "tat": ("Tatar", "Cyrl"), "tgk": ("Tajik", "Cyrl"),
    "ukr": ("Ukrainian", "Cyrl"),
    # Greek, Armenian, Georgian
    "ell": ("Greek", "Grek"), "hye": ("Armenian", "Armn"), "kat": ("Georgian", "Geor"),
    # Arabic script
    "ara": ("Arabic", "Arab"), "arb": ("Standard Arabic", "Arab"), "arz": ("Egyptian Arabic", "Arab"),
    "ary": ("Moroccan Arabic", "Arab"), "ckb": ("Central Kurdish", "Arab"), "fas": ("Persian", "Arab"),
    "pes": ("Iranian Persian", "Arab"), "prs": ("Dari", "Arab"), "pus": ("Pashto", "Arab"),
    "snd": ("Sindhi", "Arab"), "uig": ("Uyghur", "Arab"), "urd": ("Urdu", "Arab"),
    # Hebrew, Thaana
    "heb": ("Hebrew", "Hebr"), "yid": ("Yiddish", "Hebr"), "div": ("Dhivehi", "Thaa"),
    # Brahmic scripts of South Asia
    "bho": ("Bhojpuri", "Deva"), "hin": ("Hindi", "Deva"), "mai": ("Maithili", "Deva"),
    "mar": ("Marathi", "Deva"), "nep": ("Nepali", "Deva"), "npi": ("Nepali (individual language)", "Deva"),
    "san": ("Sanskrit", "Deva"), "asm": ("Assamese", "Beng"), "ben": ("Bengali", "Beng"),
    "pan": ("Punjabi", "Guru"), "guj": ("Gujarati", "Gujr"), "ori": ("Oriya", "Orya"),
    "ory": ("Odia", "Orya"), "tam": ("Tamil", "Taml"), "tel": ("Telugu", "Telu"),
    "kan": ("Kannada", "Knda"), "mal": ("Malayalam", "Mlym"), "sin": ("Sinhala", "Sinh"),
    "bod": ("Tibetan", "Tibt"),
    # South-East Asia
    "tha": ("Thai", "Thai"), "lao": ("Lao", "Laoo"), "khm": ("Khmer", "Khmr"), "mya": ("Burmese", "Mymr"),
    # Ethiopic, Cherokee
    "amh": ("Amharic", "Ethi"), "tir": ("Tigrinya", "Ethi"), "chr": ("Cherokee", "Cher"),
    # East Asia
    "cmn": ("Mandarin Chinese", "Hans"), "zho": ("Chinese", "Hans"), "wuu": ("Wu Chinese", "Hans"),
    "yue": ("Cantonese", "Hant"), "lzh": ("Literary Chinese", "Hant"), "jpn": ("Japanese", "Jpan"),
    "kor": ("Korean", "Kore"),
}

# Tatoeba codes that are not ISO 639-3 and name no natural language (CycL, a logic language); their
# lines are skipped, not reported as malformed. Add a code here if a new export brings another.
TATOEBA_NOT_ISO = frozenset({"cycl"})

LANG_CODE = re.compile(r"[a-z]{3}")
SCRIPT_CODE = re.compile(r"[A-Z][a-z]{3}")
GRAPHEME = regex.compile(r"\X")
TATOEBA_MEMBER = "sentences.csv"
UDHR_FILE = re.compile(r"(?:^|/)udhr_([^/]+)\.xml$")
# What MySQL's LOAD DATA reads after a backslash; any other character stands for itself.
MYSQL_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}


class TextError(UserError, ValueError):
    """A source or a request the selection cannot use; the message names the place and the fix."""


@dataclass(frozen=True, slots=True)
class Text:
    """One candidate text; `where` (file and line or element) is for messages, not for the output."""

    id: str
    source: str
    lang: str
    script: str | None
    text: str
    where: str


# --- the language registry ------------------------------------------------------------------------

def pinned(sha256: str | None, what: str) -> str | None:
    """A pinned SHA-256 in lowercase, or None for none ('' or None); a malformed one: TextError naming
    `what` (the parity selection's sources and their downloads)."""
    try:
        return files.pinned(sha256)
    except ValueError as err:
        raise TextError(f"{what}: {err}") from err


def check_code(code: str, where: str) -> str:
    if not LANG_CODE.fullmatch(code):
        raise TextError(f"{where}: language code {code!r} is not well-formed: an ISO 639-3 code is three "
                        "lowercase letters (e.g. 'ces', 'cmn'); correct it")
    return code


def language(code: str, where: str = "--languages") -> tuple[str, str]:
    """(English name, ISO 15924 script) of a registered language, or a TextError saying how to add it."""
    check_code(code, where)
    if code not in LANGUAGES:
        raise TextError(f"{where}: language {code!r} is not in the language registry "
                        "(LANGUAGES in encoder_study/data/texts.py); add it there with its English name and "
                        "ISO 15924 script, or drop it from the languages asked for")
    return LANGUAGES[code]


# --- Tatoeba --------------------------------------------------------------------------------------

@contextlib.contextmanager
def _open_tatoeba(path: Path) -> Iterator[tuple[str, io.BufferedIOBase]]:
    """(name for messages, binary stream) of sentences.csv, in a .tar.bz2 or as a plain file."""
    if not path.is_file():
        raise TextError(f"{path}: no such file; give Tatoeba's sentences.tar.bz2 or its sentences.csv")
    if tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as archive:
            members = [m for m in archive.getmembers() if m.isfile()]
            named = [m for m in members if Path(m.name).name == TATOEBA_MEMBER]
            chosen = named if named else members
            if len(chosen) != 1:
                raise TextError(f"{path}: expected one {TATOEBA_MEMBER} in the archive, found "
                                f"{[m.name for m in members]}; give the export's sentences.tar.bz2")
            with archive.extractfile(chosen[0]) as stream:
                yield f"{path}:{chosen[0].name}", stream
    else:
        with open(path, "rb") as stream:
            yield str(path), stream


def _logical_lines(name: str, stream: io.BufferedIOBase) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each record; a newline after an odd run of backslashes is data."""
    pending, start = "", 0
    for number, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TextError(f"{name}, line {number}: not UTF-8 ({err.reason} at byte {err.start}); "
                            "the export is UTF-8: download it again") from None
        nul = line.find("\x00")
        if nul >= 0:
            raise TextError(f"{name}, line {number}: a NUL byte (character {nul + 1}); text holds none: the "
                            "file is damaged or not text: download it again")
        if not pending:
            start = number
        line = pending + line
        body = line[:-1] if line.endswith("\n") else line
        trailing = len(body) - len(body.rstrip("\\"))
        if line.endswith("\n") and trailing % 2 == 1:
            pending = line  # an escaped newline: the record goes on
            continue
        pending = ""
        yield start, body
    if pending:
        yield start, pending


def _mysql_fields(body: str) -> list[str | None]:
    """Split a record on unescaped tabs and undo MySQL's escaping; `\\N` alone is NULL."""
    if "\\" not in body:
        return body.split("\t")  # the common case, kept fast for 13 million lines
    fields: list[str | None] = []
    out: list[str] = []
    raw: list[str] = []  # the field as written, to recognise \N
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            out.append(MYSQL_ESCAPES.get(body[i + 1], body[i + 1]))
            raw.append(body[i:i + 2])
            i += 2
            continue
        if c == "\t":
            fields.append(None if "".join(raw) == "\\N" else "".join(out))
            out, raw = [], []
        else:
            out.append(c)
            raw.append(c)
        i += 1
    fields.append(None if "".join(raw) == "\\N" else "".join(out))
    return fields


@dataclass(frozen=True, slots=True)
class Anomaly:
    """Something odd in a source and what the reader did about it, for the provenance fragment."""

    source: str
    file: str
    what: str
    done: str


@dataclass
class SourceStats:
    """What a reader saw, for the provenance note and its table of anomalies."""

    records: int = 0
    no_language: int = 0     # Tatoeba's `\N`
    empty_language: int = 0  # Tatoeba lines whose language field is empty instead of `\N`
    not_iso: int = 0
    empty: int = 0
    files: int = 0
    skipped_files: int = 0
    anomalies: list[Anomaly] = field(default_factory=list)


def read_tatoeba(path: str | os.PathLike, stats: SourceStats | None = None) -> Iterator[Text]:
    """Every sentence of a Tatoeba export with a language code; malformed lines raise TextError."""
    path = Path(path)
    stats = stats if stats is not None else SourceStats()
    seen = _SeenIds()
    good_codes: set[str] = set()  # codes already checked: the check runs once per language, not per line
    before = (stats.no_language, stats.empty_language, stats.not_iso)  # the stats may span several reads
    with _open_tatoeba(path) as (name, stream):
        stats.files += 1
        for number, body in _logical_lines(name, stream):
            where = f"{name}, line {number}"
            fields = _mysql_fields(body)
            if len(fields) != 3:
                raise TextError(f"{where}: expected 3 tab-separated fields (sentence id, language, text), "
                                f"found {len(fields)}; this is not Tatoeba's sentences.csv format: fix or "
                                "remove the line")
            sid, lang, text = fields
            if sid is None or not sid.isascii() or not sid.isdigit() or int(sid) <= 0:
                shown = "\\N" if sid is None else repr(sid)
                raise TextError(f"{where}: sentence id {shown} is not a positive integer; fix or remove the "
                                "line")
            n = int(sid)
            if seen.add(n):
                raise TextError(f"{where}: sentence id {n} occurs on an earlier line too; ids must be "
                                "unique: remove one of the lines")
            text = (text or "").strip()
            if not text:
                raise TextError(f"{where}: sentence {n} has empty text; remove the line")
            stats.records += 1
            if lang is None:
                stats.no_language += 1  # Tatoeba's `\N`: nobody said which language it is
                continue
            if lang == "":
                stats.empty_language += 1  # an old Tatoeba bug stored "unknown" as '' instead of NULL
                continue
            if lang in TATOEBA_NOT_ISO:
                stats.not_iso += 1
                continue
            if lang not in good_codes:
                good_codes.add(check_code(lang, where))
            script = LANGUAGES.get(lang, (None, None))[1]
            yield Text(f"tatoeba:{n}", "tatoeba", lang, script, text, where)
    short = path.name if name == str(path) else f"{path.name}:{name[len(str(path)) + 1:]}"
    _note_skipped_languages(stats, before, short)


class _SeenIds:
    """The sentence ids read so far: one bit per id below 2**27, so that duplicates are found without
    a set of 13 million ints; larger ids (none in Tatoeba's export) in a set."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.large: set[int] = set()

    def add(self, n: int) -> bool:
        """Record id `n`; whether it was seen before."""
        if n < 1 << 27:
            byte, bit = divmod(n, 8)
            if byte >= len(self.bits):
                self.bits.extend(bytes(byte + 1 - len(self.bits) + (1 << 16)))
            duplicate = self.bits[byte] >> bit & 1
            self.bits[byte] |= 1 << bit
            return bool(duplicate)
        duplicate = n in self.large
        self.large.add(n)
        return duplicate


def _note_skipped_languages(stats: SourceStats, before: tuple[int, int, int], short: str) -> None:
    """An anomaly for each kind of language field this read skipped (counts since `before`)."""
    counts = (stats.no_language, stats.empty_language, stats.not_iso)
    whats = ("language \\N (unknown)", "an empty language field (an old Tatoeba bug; means \\N)",
             f"a code that names no natural language ({', '.join(sorted(TATOEBA_NOT_ISO))})")
    for now, then, what in zip(counts, before, whats, strict=True):
        count = now - then
        if count:
            stats.anomalies.append(Anomaly("tatoeba", short, f"{count} sentence(s) with {what}",
                                           "skipped deliberately, counted"))


# --- UDHR -----------------------------------------------------------------------------------------

UDHR_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # no ':' so that `udhr:<key>:...` ids stay unique
# Elements whose paragraphs are not the declaration's text: headings and editorial notes.
UDHR_NOT_TEXT = frozenset({"title", "note"})
ZIP_READ_ERRORS = (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, zlib.error)


def _udhr_documents(path: Path) -> Iterator[tuple[str, str, str, bytes | Exception]]:
    """(name for messages, short name for the table, key from the file name, bytes or the error that
    kept them from being read) of every udhr_<key>.xml, sorted by name: the order fixes which of two
    files with one key is kept, so it must not depend on the order of the directory or archive."""
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and UDHR_FILE.search(p.name))
        if not found:
            raise TextError(f"{path}: no udhr_<key>.xml files in this directory; give the UDHR's "
                            "udhr_xml.zip or the directory it unpacks to")
        for p in found:
            try:
                data: bytes | Exception = p.read_bytes()
            except OSError as err:
                data = err
            yield str(p), p.name, UDHR_FILE.search(p.name)[1], data
        return
    if not path.is_file():
        raise TextError(f"{path}: no such file or directory; give the UDHR's udhr_xml.zip or a directory "
                        "of udhr_<key>.xml files")
    if not zipfile.is_zipfile(path):
        raise TextError(f"{path}: not a zip archive; give the UDHR's udhr_xml.zip or a directory of "
                        "udhr_<key>.xml files")
    with zipfile.ZipFile(path) as archive:
        # Two members may share a name; CRC and size then order them whatever the archive's order.
        infos = sorted((i for i in archive.infolist() if not i.is_dir() and UDHR_FILE.search(i.filename)),
                       key=lambda i: (i.filename, i.CRC, i.file_size))
        if not infos:
            raise TextError(f"{path}: the archive holds no udhr_<key>.xml files; give the UDHR's "
                            "udhr_xml.zip")
        for info in infos:
            try:
                data = archive.read(info)
            except ZIP_READ_ERRORS as err:
                data = err
            yield f"{path}:{info.filename}", info.filename, UDHR_FILE.search(info.filename)[1], data


def _local(tag) -> str:
    """An element's name without its namespace ('' for a comment or processing instruction)."""
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _paragraphs(element: ET.Element) -> Iterator[ET.Element]:
    """The `para` elements under `element` in document order, lists nested at any depth included; not
    those of a title or note, nor a para inside a para (the outer one's text holds it already).
    A stack, not recursion, so that no nesting depth can raise."""
    stack = [iter(element)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
            continue
        name = _local(child.tag)
        if name == "para":
            yield child
        elif name not in UDHR_NOT_TEXT:
            stack.append(iter(child))


def _listed(items: list[str], limit: int = 6) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


class _Document:
    """One UDHR file being read: its anomalies go to the stats under its short name."""

    def __init__(self, name: str, short: str, stats: SourceStats):
        self.name, self.short, self.stats = name, short, stats

    def odd(self, what: str, done: str) -> None:
        self.stats.anomalies.append(Anomaly("udhr", self.short, what, done))

    def skip(self, what: str) -> list[Text]:
        self.odd(what, "skipped the file")
        self.stats.skipped_files += 1
        return []


def _read_document(doc: _Document, file_key: str, data: bytes | Exception, claimed: dict[str, str]
                   ) -> list[Text]:
    """The non-empty paragraphs of one UDHR file, keyed by their place in the document; [] (and an
    anomaly saying why) for a file that cannot be read."""
    try:
        root = _udhr_root(data)
        _check_namespace(doc, root)
        key = _document_key(doc, root, file_key, claimed)
        lang, script = _document_language(doc, root, key)
    except _Skip as skip:
        return doc.skip(str(skip))
    found = _document_texts(doc, root, key, lang, script)
    if not found:
        return doc.skip("no non-empty paragraph in a <preamble> or <article>")
    claimed[key] = doc.short
    return found


class _Skip(Exception):
    """Why a UDHR file is skipped: an anomaly of the selection, never an error."""


def _udhr_root(data: bytes | Exception) -> ET.Element:
    """The file's <udhr> element; _Skip when there is none."""
    if isinstance(data, Exception):
        raise _Skip(f"could not be read ({type(data).__name__}: {data})")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        nul = data.find(b"\x00")  # asked only now: a UTF-16 file holds NUL bytes and parses
        if nul >= 0:
            line = data.count(b"\n", 0, nul) + 1
            raise _Skip(f"a NUL byte at line {line}: the file is damaged or not text") from err
        line, column = err.position
        reason = re.sub(r": line \d+, column \d+$", "", str(err))  # the place is said already
        raise _Skip(f"not well-formed XML at line {line}, column {column} ({reason})") from err
    except (ValueError, LookupError) as err:  # e.g. an encoding expat does not know
        raise _Skip(f"not readable as XML ({err})") from err
    if _local(root.tag) != "udhr":
        raise _Skip(f"root element is <{_local(root.tag) or root.tag}>, not <udhr>")
    return root


def _check_namespace(doc: _Document, root: ET.Element) -> None:
    """Another namespace is odd but readable: the elements are read by their names alone."""
    namespace = root.tag[1:].partition("}")[0] if root.tag.startswith("{") else ""
    if namespace != UDHR_NS:
        shown = f"namespace {namespace!r}" if namespace else "no namespace"
        doc.odd(f"<udhr> in {shown}, not {UDHR_NS}", "read it by element names alone")


def _document_key(doc: _Document, root: ET.Element, file_key: str, claimed: dict[str, str]) -> str:
    """The key attribute, else the file name's key; _Skip when neither is usable or an earlier file
    claimed it."""
    attribute = root.get("key")
    if attribute is not None and UDHR_KEY.fullmatch(attribute.strip()):
        key = attribute.strip()
        if key != file_key:
            doc.odd(f"key={key!r} differs from the file name's {file_key!r}", "used the attribute")
    elif UDHR_KEY.fullmatch(file_key):
        key = file_key
        doc.odd("no key attribute" if attribute is None else f"key={attribute!r} is not a usable key",
                f"used the file name's key {file_key!r}")
    else:
        raise _Skip(f"no usable key (attribute {attribute!r}, file name {file_key!r})")
    if key in claimed:
        raise _Skip(f"key {key!r} was already read from {claimed[key]} (files are read in name "
                        "order)")
    return key


def _document_language(doc: _Document, root: ET.Element, key: str) -> tuple[str, str | None]:
    """(language, script) from the attributes, else from the key and the registry; _Skip when the
    language is unknown."""
    code = root.get("iso639-3")
    if code is not None:
        code = code.strip()
        if not LANG_CODE.fullmatch(code):
            raise _Skip(f"iso639-3={code!r} is not an ISO 639-3 code (three lowercase letters), so "
                            "its language is unknown")
        lang = code
    else:
        lang = key.split("_")[0]
        if not LANG_CODE.fullmatch(lang):
            raise _Skip(f"no iso639-3 attribute, and the key {key!r} does not begin with a code")
        doc.odd("no iso639-3 attribute", f"took the language {lang!r} from the key")
    script = root.get("iso15924")
    registered = LANGUAGES.get(lang, (None, None))[1]
    if script is not None and not SCRIPT_CODE.fullmatch(script.strip()):
        doc.odd(f"iso15924={script!r} is not a script code",
                f"used the registry's script {registered!r}" if registered else
                "no script: its texts are not eligible")
        script = None
    return lang, script.strip() if script is not None else registered


def _document_texts(doc: _Document, root: ET.Element, key: str, lang: str, script: str | None) -> list[Text]:
    """The non-empty paragraphs of the preambles and articles, keyed by their place."""
    found: list[Text] = []
    empty: list[str] = []
    preambles = articles = 0
    for child in root:
        name = _local(child.tag)
        if name == "preamble":
            preambles += 1
        elif name == "article":
            articles += 1
        else:
            continue  # title, note: not the declaration's text
        section, element_name = _section(doc, child, name, preambles, articles)
        paras = 0
        for index, para in enumerate(_paragraphs(child), 1):
            paras = index
            doc.stats.records += 1
            text = "".join(para.itertext()).strip()
            if not text:
                doc.stats.empty += 1  # unfinished translations leave paragraphs empty
                empty.append(f"{section} para {index}")
                continue
            where = f"{doc.name}, element <{element_name}> ({section}), para {index}"
            found.append(Text(f"udhr:{key}:{section}:{index}", "udhr", lang, script, text, where))
        if not paras:
            doc.odd(f"{section} has no paragraph", "nothing to read there")
    if empty:
        doc.odd(f"{len(empty)} empty paragraph(s): {_listed(empty)}", "skipped them")
    return found


def _section(doc: _Document, child: ET.Element, name: str, preambles: int, articles: int) -> tuple[str, str]:
    """(section, element as messages name it) of the `preambles`-th preamble or the `articles`-th
    article: keyed by its place, whatever it is numbered."""
    if name == "preamble":
        section = "preamble" if preambles == 1 else f"preamble-{preambles}"
        if preambles > 1:
            doc.odd(f"<preamble> number {preambles} in the file", f"read it as {section}")
        return section, "preamble"
    section = f"article-{articles}"  # its place among the articles, whatever it is numbered
    number = child.get("number")
    element_name = "article" if number is None else f"article number={number!r}"
    if number is None:
        doc.odd(f"article {articles} (in document order) has no number attribute",
                f"keyed by its place: {section}")
    elif number.strip() != str(articles):
        doc.odd(f"article {articles} (in document order) is numbered {number!r}",
                f"keyed by its place: {section}")
    return section, element_name


def read_udhr(path: str | os.PathLike, stats: SourceStats | None = None) -> Iterator[Text]:
    """Every non-empty paragraph of the preamble and the articles of every translation, keyed by its
    place in the document (`udhr:<key>:article-<k>:<i>`: the k-th article, its i-th paragraph).

    Real files are messy; none stops the reading. A file that cannot be read (not XML, no key or
    language, a key an earlier file has, nothing in it) is skipped; what is odd but readable (an
    article numbered out of place, another namespace, empty paragraphs) is read. Each is recorded in
    `stats.anomalies`. Only a source that is no UDHR assembly at all raises TextError.
    """
    path = Path(path)
    stats = stats if stats is not None else SourceStats()
    claimed: dict[str, str] = {}  # key -> the file it was read from
    for name, short, file_key, data in _udhr_documents(path):
        stats.files += 1
        yield from _read_document(_Document(name, short, stats), file_key, data, claimed)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


