"""CoNLL-U treebanks for UPOS tagging: read with line-numbered errors, written back with only UPOS
changed, and UD English-EWT fetched by URL with its SHA-256.

Reading
-------
A file is read line by line, so that every error names its line and every sentence keeps its raw
lines: a predictions file is the gold file with only the UPOS column of the word rows replaced, byte
for byte otherwise, so the standard UD evaluation script reads it like the gold file. The `conllu`
package parses the parts of a line (the ID, the comments); its own line splitter is not used because
it strips lines, also splits columns on two spaces, and does not report line numbers.

Words are the rows with an integer ID. Multiword-token rows (`3-4`) and empty nodes (`5.1`) stay in
the raw lines but are not scored. The text an encoder reads is the sentence's `# text`: every surface
token (a multiword token, or a word outside one) is placed in it in order, skipping whitespace
between tokens, and a word's range is where its token was placed. The syntactic words of a multiword
token split its range when their forms spell the surface form (`cannot` = `can` + `not` gives
[0, 3) and [3, 6)); otherwise (Spanish `del` = `de` + `el`) each of them gets the whole surface range,
the only part of the text the encoder can tie to it.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conllu.exceptions import ParseException
from conllu.parser import parse_comment_line, parse_id_value

from ..core import files
from ..core.errors import UserError
from ..core.tables import markdown_table
from .doc import Doc

UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
        "PUNCT", "SCONJ", "SYM", "VERB", "X")
COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")

_UPOS_COLUMN = COLUMNS.index("UPOS")
_XPOS_COLUMN = COLUMNS.index("XPOS")


class TreebankError(UserError, ValueError):
    """A treebank file cannot be read or fetched; the message names the file, the line and the fix."""


def _fail(name: str, line: int, message: str) -> TreebankError:
    return TreebankError(f"{name}:{line}: {message}")


# ---------------------------------------------------------------------------------------------------------
# Sentences


@dataclass(frozen=True)
class Word:
    """A syntactic word (a row with an integer ID) and its [start, end) range in the sentence text."""

    id: int
    form: str
    upos: str
    start: int
    end: int
    line: int  # 1-based line of its row in the file
    xpos: str = "_"  # the language-specific tag ('_': none given)


@dataclass(frozen=True)
class Sentence:
    """One sentence: its id, text, words, and the raw lines it was read from.

    `lines` are the file's lines with their line endings, from the sentence's first comment through
    the blank lines after it (the first sentence also holds any blank lines before it), so joining
    every sentence's lines gives the file back.
    """

    sent_id: str
    text: str
    words: tuple[Word, ...]
    lines: tuple[str, ...]
    first_line: int  # line number of lines[0]
    multiword: int = 0
    empty_nodes: int = 0
    # (line, HEAD) of word rows whose HEAD is not a number or no word of the sentence: only UPOS is read,
    # so they change nothing, but the summary (splits_table) warns of them.
    bad_heads: tuple[tuple[int, str], ...] = ()

    @property
    def upos(self) -> tuple[str, ...]:
        return tuple(w.upos for w in self.words)

    def tags(self, task: str = "upos") -> tuple[str, ...]:
        """The words' tags in the column `task` reads (data.tasks): `upos` or `xpos`."""
        if task == "upos":
            return self.upos
        if task == "xpos":
            return tuple(w.xpos for w in self.words)
        raise TreebankError(f"unknown tagging task {task!r}; the tasks are upos and xpos")

    def doc(self) -> Doc:
        """The text and word ranges an encoder turns into one vector per word."""
        return Doc(self.text, tuple((w.start, w.end) for w in self.words))

    def render(self, upos: Sequence[str] | None = None, task: str = "upos") -> str:
        """The sentence's lines, with the column of `task` (UPOS, or XPOS for `xpos`) of its word rows
        replaced by the predicted tags `upos` if given."""
        if upos is None:
            return "".join(self.lines)
        upos = list(upos)
        if len(upos) != len(self.words):
            raise TreebankError(f"sentence {self.sent_id!r}: {len(upos)} predicted tags for "
                                f"{len(self.words)} words; predict one tag per word (integer-ID row)")
        column = _UPOS_COLUMN if task == "upos" else _XPOS_COLUMN
        lines = list(self.lines)
        for word, tag in zip(self.words, upos, strict=True):
            if task == "upos" and tag not in UPOS:
                raise TreebankError(f"sentence {self.sent_id!r}, word {word.id} {word.form!r}: predicted "
                                    f"tag {tag!r} is not a UD UPOS tag ({' '.join(UPOS)})")
            if task != "upos" and (not tag or any(c.isspace() for c in tag)):
                raise TreebankError(f"sentence {self.sent_id!r}, word {word.id} {word.form!r}: predicted "
                                    f"tag {tag!r} is empty or holds white space; a CoNLL-U column cannot")
            i = word.line - self.first_line
            body, ending = _split_ending(lines[i])
            columns = body.split("\t")
            columns[column] = tag
            lines[i] = "\t".join(columns) + ending
        return "".join(lines)


def _split_ending(line: str) -> tuple[str, str]:
    for ending in ("\r\n", "\n"):
        if line.endswith(ending):
            return line[: -len(ending)], ending
    return line, ""


def _raw_lines(text: str) -> list[str]:
    """Lines with their endings; only '\\n' ends a line (str.splitlines would also split on U+2028)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _content(raw: str, index: int) -> str:
    body = _split_ending(raw)[0]
    return body.lstrip("\ufeff") if index == 0 else body  # a byte-order mark stays in the raw line


def parse_conllu(text: str, name: str = "<string>", first_line: int = 1) -> list[Sentence]:
    """Parse CoNLL-U text; `name` is what error messages call the file, `first_line` the line number of
    the text's first line there (a part of a file read piece by piece, as `tagging predict` streams)."""
    at = first_line - 1
    raw = _raw_lines(text)
    contents = [_content(line, i) for i, line in enumerate(raw)]
    lone_crs = text.count("\r") - text.count("\r\n")
    if lone_crs or "\x00" in text:  # scans of the whole text; a loop over lines only on a fault
        _refuse_characters(name, contents, at, cr_line_ends=lone_crs > text.count("\n"))
    blank = [not c.strip() for c in contents]
    blocks, i = [], 0
    while i < len(raw) and blank[i]:
        i += 1
    while i < len(raw):
        start = i
        while i < len(raw) and not blank[i]:
            i += 1
        stop = i
        while i < len(raw) and blank[i]:
            i += 1
        blocks.append((start, stop, i))
    if not blocks:
        raise _fail(name, first_line, "the file holds no sentences (it is empty or blank); a CoNLL-U "
                             "file has one block of comments and word rows per sentence: check the path or "
                             "the download")
    sentences, seen = [], {}
    for k, (start, stop, end) in enumerate(blocks):
        lines_from = 0 if k == 0 else start
        sentence = _parse_sentence(name, contents, start, stop, tuple(raw[lines_from:end]),
                                   lines_from + 1 + at, at)
        if sentence.sent_id in seen:
            raise _fail(name, start + 1 + at, f"sentence id {sentence.sent_id!r} was already used by the "
                                         f"sentence at line {seen[sentence.sent_id]}; give every sentence "
                                         "its own id")
        seen[sentence.sent_id] = start + 1 + at
        sentences.append(sentence)
    return sentences


def read_conllu(path: str | os.PathLike, name: str | None = None) -> list[Sentence]:
    """Read a CoNLL-U file; `name` (default: the path) is what error messages call it."""
    name = str(path) if name is None else name
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise _fail(name, line, f"not UTF-8 ({err.reason} at byte {err.start}); CoNLL-U files are UTF-8: "
                                "convert the file") from err
    return parse_conllu(text, name)


def _refuse_characters(name: str, contents: list[str], at: int, cr_line_ends: bool) -> None:
    """Raise for the first line holding a NUL byte or a carriage return that no line feed follows;
    `cr_line_ends`: more of those than line feeds, so the lines end in CR."""
    for index, content in enumerate(contents):
        line, nul, cr = index + 1 + at, content.find("\x00"), content.find("\r")
        if nul >= 0:
            raise _fail(name, line, f"a NUL byte (character {nul + 1} of the line); text holds none: the "
                                    "file is damaged or not text (a binary file, a broken download): check "
                                    "the path or fetch it again")
        if cr < 0:
            continue
        if cr_line_ends:
            raise _fail(name, line, "the lines end in a carriage return (CR) alone (classic Mac OS line "
                                    "ends), which CoNLL-U does not allow (LF, or CRLF): convert them, e.g. "
                                    "tr '\\r' '\\n' < FILE > FIXED")
        raise _fail(name, line, f"a carriage return (CR) that no line feed follows (character {cr + 1} of "
                                "the line); no CoNLL-U field holds one: remove it")


@dataclass
class _Row:
    line: int
    columns: list[str]
    id: int | tuple


def _parse_sentence(name: str, contents: list[str], start: int, stop: int, lines: tuple[str, ...],
                    first_line: int, at: int = 0) -> Sentence:
    """One block of non-blank lines, contents[start:stop], into a Sentence; `at` is added to every line
    number (the lines before the text parsed)."""
    metadata, rows = _read_rows(name, contents, start, stop, at)
    start, stop = start + at, stop + at  # from here on, line numbers only
    where = f"the sentence at lines {start + 1}-{stop}"
    if not rows:
        raise _fail(name, start + 1, f"{where} has comments but no word rows; remove the blank line that "
                                     "separates these comments from their sentence, or the comments")
    if "sent_id" not in metadata:
        raise _fail(name, start + 1, f"{where} has no '# sent_id = ...' comment; give every sentence a "
                                     "unique id")
    sent_id = metadata["sent_id"][0]
    if "text" not in metadata:
        raise _fail(name, start + 1, f"sentence {sent_id!r} (lines {start + 1}-{stop}) has no "
                                     "'# text = ...' comment (or an empty one); the text an encoder reads "
                                     "comes from it: add the sentence's surface text before its first row")
    text, text_line = metadata["text"]
    words, surface, multiword, empty = _words(name, rows, sent_id)
    bad_heads = _bad_heads(rows, len(words))
    if not words:
        raise _fail(name, start + 1, f"sentence {sent_id!r} has no word rows (integer IDs)")
    ranges = _place(name, sent_id, text, text_line, words, surface)
    return Sentence(
        sent_id=sent_id,
        text=text,
        words=tuple(Word(i, f, u, *ranges[i], line, x) for i, f, u, line, x in words),
        lines=lines,
        first_line=first_line,
        multiword=multiword,
        empty_nodes=empty,
        bad_heads=bad_heads,
    )


def _read_rows(name: str, contents: list[str], start: int, stop: int,
               at: int) -> tuple[dict[str, tuple[str, int]], list[_Row]]:
    """The comments (key -> (value, line)) and the rows of contents[start:stop], each row's columns
    and ID checked."""
    metadata: dict[str, tuple[str, int]] = {}
    rows: list[_Row] = []
    for index in range(start, stop):
        line, content = index + 1 + at, contents[index]
        if content.startswith("#"):
            for key, value in parse_comment_line(content):
                metadata[key] = (value, line)
            continue
        columns = content.split("\t")
        if len(columns) != len(COLUMNS):
            raise _fail(name, line, f"{len(columns)} tab-separated column(s), expected {len(COLUMNS)} "
                                    f"({' '.join(COLUMNS)}); separate columns by single tabs and write '_' "
                                    "in an empty column")
        try:
            row_id = parse_id_value(columns[0])
        except ParseException as err:
            row_id, reason = None, str(err)
        else:
            reason = "an ID is required"
        if row_id is None:
            raise _fail(name, line, f"bad ID {columns[0]!r} ({reason}); a row's ID is a word number (3), "
                                    "a multiword-token range (3-4) or an empty node (3.1)")
        rows.append(_Row(line, columns, row_id))
    return metadata, rows


def _words(name: str, rows: list[_Row], sent_id: str) -> tuple[list[tuple[int, str, str, int, str]],
                                                                list[tuple[str, int, int, int]], int, int]:
    """The words in order (id, form, upos, line, xpos), the surface tokens to place in the text (form, first
    word, last word, line), and the counts of multiword tokens and empty nodes."""
    words: list[tuple[int, str, str, int, str]] = []
    surface: list[tuple[str, int, int, int]] = []
    multiword = empty = 0
    covered_to = 0  # the last word id inside the current multiword token
    token = None  # the current multiword token's row
    for row in rows:
        form = row.columns[1]
        if isinstance(row.id, tuple) and row.id[1] == ".":
            empty += 1  # an empty node has no surface form
            continue
        if isinstance(row.id, tuple):
            first, _, last = row.id
            if first != len(words) + 1 or last <= first:
                raise _fail(name, row.line, f"multiword token {row.columns[0]} in sentence {sent_id!r} does "
                                            f"not start at the next word ({len(words) + 1}) or spans fewer "
                                            "than two words; put its row right before its first word's")
            if token is not None and covered_to >= first:
                raise _fail(name, token.line, f"multiword token {token.columns[0]} in sentence {sent_id!r} "
                                              f"runs to word {covered_to}, into the multiword token "
                                              f"{row.columns[0]} of line {row.line}; a multiword token "
                                              "spans only its own words: fix its range")
            surface.append((form, first, last, row.line))
            covered_to, token = last, row
            multiword += 1
            continue
        if row.id != len(words) + 1:
            raise _fail(name, row.line, f"word ID {row.id} in sentence {sent_id!r} is out of order; word IDs "
                                        f"run 1, 2, 3, ... and this row should be {len(words) + 1}")
        upos = row.columns[_UPOS_COLUMN]
        if upos not in UPOS:
            raise _fail(name, row.line, f"unknown UPOS {upos!r} for word {row.id} {form!r}; the 4th column "
                                        f"takes one of the 17 UD tags: {' '.join(UPOS)}")
        words.append((row.id, form, upos, row.line, row.columns[_XPOS_COLUMN]))
        if row.id > covered_to:
            surface.append((form, row.id, row.id, row.line))
    if covered_to > len(words):
        raise _fail(name, token.line, f"multiword token {token.columns[0]} in sentence {sent_id!r} ends at "
                                      f"word {covered_to}, but the sentence has only {len(words)} words; fix "
                                      "its range or add its words' rows")
    return words, surface, multiword, empty


_HEAD_COLUMN = COLUMNS.index("HEAD")


def _bad_heads(rows: list[_Row], words: int) -> tuple[tuple[int, str], ...]:
    """(line, HEAD) of the word rows whose HEAD is not 0 or the number of a word of the sentence."""
    bad = []
    for row in rows:
        if isinstance(row.id, int):
            head = row.columns[_HEAD_COLUMN]
            if not (head.isascii() and head.isdigit() and int(head) <= words):
                bad.append((row.line, head))
    return tuple(bad)


def _place(name: str, sent_id: str, text: str, text_line: int, words: list[tuple[int, str, str, int]],
           surface: list[tuple[str, int, int, int]]) -> dict[int, tuple[int, int]]:
    """Each word's [start, end) in the text: the surface tokens placed in it in order."""
    ranges: dict[int, tuple[int, int]] = {}
    pos = 0
    for form, first, last, line in surface:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not form or not text.startswith(form, pos):
            raise _fail(name, line, f"sentence {sent_id!r}: the form {form!r} cannot be placed in the "
                                    f"# text (line {text_line}) at character {pos}, where it reads "
                                    f"{text[pos:pos + 20]!r}; the # text must be the forms in order, joined "
                                    "by spaces (nothing after SpaceAfter=No): fix the # text or the form")
        start_char, pos = pos, pos + len(form)
        members = [words[i - 1][1] for i in range(first, last + 1)]
        if last > first and "".join(members) == form:
            at = start_char
            for i, member in zip(range(first, last + 1), members, strict=True):
                ranges[i] = (at, at + len(member))
                at += len(member)
        else:
            for i in range(first, last + 1):
                ranges[i] = (start_char, pos)
    if text[pos:].strip():
        raise _fail(name, text_line, f"sentence {sent_id!r}: the # text goes on after the last form: "
                                     f"{text[pos:pos + 20]!r} at character {pos} matches no word row; "
                                     "fix the # text or add the missing rows")
    return ranges


def render(sentences: Sequence[Sentence], predicted_upos: Sequence[Sequence[str]] | None = None,
           task: str = "upos") -> str:
    """The file the sentences were read from, with the column of `task` (UPOS, or XPOS) replaced by the
    predictions if given."""
    if predicted_upos is None:
        return "".join(s.render() for s in sentences)
    predicted_upos = list(predicted_upos)
    if len(predicted_upos) != len(sentences):
        raise TreebankError(f"{len(predicted_upos)} predicted sentences for {len(sentences)} sentences; "
                            "predict every sentence, in the file's order")
    return "".join(s.render(tags, task) for s, tags in zip(sentences, predicted_upos, strict=True))


def write_predictions(sentences: Sequence[Sentence], predicted_upos: Sequence[Sequence[str]],
                      path: str | os.PathLike, task: str = "upos") -> None:
    """Write the gold file with only the task's column (UPOS, or XPOS) of its word rows replaced by the
    predictions (atomically)."""
    data = render(sentences, predicted_upos, task).encode("utf-8")
    with files.atomic_path(path) as tmp:
        tmp.write_bytes(data)


# ---------------------------------------------------------------------------------------------------------
# Summaries


def upos_counts(sentences: Iterable[Sentence]) -> Counter:
    return Counter(tag for s in sentences for tag in s.upos)


def most_frequent_tag_accuracy(train: Sequence[Sentence], test: Sequence[Sentence]) -> float:
    """Accuracy on `test` of tagging each form with its most frequent tag in `train` (ties: the tag
    first in UPOS order), and a form never seen with the most frequent tag overall."""
    by_form: dict[str, Counter] = defaultdict(Counter)
    for s in train:
        for w in s.words:
            by_form[w.form][w.upos] += 1
    overall = upos_counts(train)
    fallback = min(overall, key=lambda t: (-overall[t], t)) if overall else "NOUN"
    best = {form: min(c, key=lambda t: (-c[t], t)) for form, c in by_form.items()}
    gold = [(w.form, w.upos) for s in test for w in s.words]
    if not gold:
        return float("nan")
    return sum(best.get(form, fallback) == tag for form, tag in gold) / len(gold)


def splits_table(by_split: dict[str, Sequence[Sentence]]) -> str:
    """Per split: sentences, words, multiword tokens, empty nodes, forms, forms seen with several tags."""
    rows = []
    for split, sentences in by_split.items():
        tags_of: dict[str, set] = defaultdict(set)
        for s in sentences:
            for w in s.words:
                tags_of[w.form].add(w.upos)
        rows.append((split, len(sentences), sum(len(s.words) for s in sentences),
                     sum(s.multiword for s in sentences), sum(s.empty_nodes for s in sentences),
                     len(tags_of), sum(len(t) > 1 for t in tags_of.values())))
    header = ["split", "sentences", "words", "multiword tokens", "empty nodes", "forms", "ambiguous forms"]
    return markdown_table(header, rows, "lrrrrrr") + "".join(
        _head_warning(split, sentences) for split, sentences in by_split.items())


def _head_warning(split: str, sentences: Sequence[Sentence]) -> str:
    """A paragraph after the table for a split with word rows whose HEAD is no word; '' for none."""
    bad = [(s.sent_id, line, head) for s in sentences for line, head in s.bad_heads]
    if not bad:
        return ""
    sent_id, line, head = bad[0]
    return (f"\nWarning: {split}: {len(bad)} word row(s) with a HEAD that is not a number or not a word of "
            f"their sentence (the first: line {line}, sentence {sent_id!r}, HEAD {head!r}); only UPOS is "
            "read, so no score changes, but the file is not valid CoNLL-U.\n")


def upos_table(by_split: dict[str, Sequence[Sentence]]) -> str:
    """UPOS counts (and share of words) per split, one row per tag."""
    counts = {split: upos_counts(s) for split, s in by_split.items()}
    rows = []
    for tag in UPOS:
        row = [tag]
        for split in by_split:
            total = sum(counts[split].values()) or 1
            row.append(f"{counts[split][tag]} ({100 * counts[split][tag] / total:.1f}%)")
        rows.append(row)
    return markdown_table(["UPOS", *by_split], rows, "l" + "r" * len(by_split))


# ---------------------------------------------------------------------------------------------------------
# Fetching


local_path = files.local_path  # a plain path or file:// URL -> Path; a network URL -> None


def pinned(sha256: str | None) -> str | None:
    """A pinned SHA-256 in lowercase, or None when none is pinned ('' or None)."""
    try:
        return files.pinned(sha256)
    except ValueError as err:
        raise TreebankError(str(err)) from err


