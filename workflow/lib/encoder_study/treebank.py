"""Treebanks for UPOS tagging: CoNLL-U in and out, UD English-EWT fetched by URL, and a synthetic
treebank for the embedded default.

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

The synthetic treebank
----------------------
Sentences are drawn from templates (`TEMPLATES`) over word classes (`CLASSES`) with a seeded numpy
Generator, one independent stream per split, so the test split does not change when the train size
does. Many common words take different tags in different templates (`run` is a NOUN after a
determiner and a VERB after a pronoun or `can`), so a most-frequent-tag baseline stays clearly below
100% while a tagger that reads the context can do much better. The files use every UD feature the
reader handles (multiword tokens, `SpaceAfter=No`, sentence ids, `# text`, Unicode names) and are
read back through the same code as EWT. The dependency columns hold a flat tree (every word attached
to one root), valid for the evaluation script but not a real analysis: only UPOS is meant to be learned.
"""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conllu.exceptions import ParseException
from conllu.parser import parse_comment_line, parse_id_value

from . import files, provenance
from .errors import UserError
from .tokens import Doc

UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
        "PUNCT", "SCONJ", "SYM", "VERB", "X")
COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")
SPLITS = ("train", "dev", "test")
EWT_URL = "https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/r2.18/en_ewt-ud-{split}.conllu"
SIZES = {"train": 1500, "dev": 300, "test": 300}

_UPOS_COLUMN = COLUMNS.index("UPOS")


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

    @property
    def upos(self) -> tuple[str, ...]:
        return tuple(w.upos for w in self.words)

    def doc(self) -> Doc:
        """The text and word ranges an encoder turns into one vector per word."""
        return Doc(self.text, tuple((w.start, w.end) for w in self.words))

    def render(self, upos: Sequence[str] | None = None) -> str:
        """The sentence's lines, with the UPOS column of its word rows replaced by `upos` if given."""
        if upos is None:
            return "".join(self.lines)
        upos = list(upos)
        if len(upos) != len(self.words):
            raise TreebankError(f"sentence {self.sent_id!r}: {len(upos)} predicted tags for "
                                f"{len(self.words)} words; predict one UPOS per word (integer-ID row)")
        lines = list(self.lines)
        for word, tag in zip(self.words, upos, strict=True):
            if tag not in UPOS:
                raise TreebankError(f"sentence {self.sent_id!r}, word {word.id} {word.form!r}: predicted "
                                    f"tag {tag!r} is not a UD UPOS tag ({' '.join(UPOS)})")
            i = word.line - self.first_line
            body, ending = _split_ending(lines[i])
            columns = body.split("\t")
            columns[_UPOS_COLUMN] = tag
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


def parse_conllu(text: str, name: str = "<string>") -> list[Sentence]:
    """Parse CoNLL-U text; `name` is what error messages call the file."""
    raw = _raw_lines(text)
    contents = [_content(line, i) for i, line in enumerate(raw)]
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
        raise _fail(name, 1, "the file holds no sentences (it is empty or blank); a CoNLL-U "
                             "file has one block of comments and word rows per sentence: check the path or "
                             "the download")
    sentences, seen = [], {}
    for k, (start, stop, end) in enumerate(blocks):
        lines_from = 0 if k == 0 else start
        sentence = _parse_sentence(name, contents, start, stop, tuple(raw[lines_from:end]), lines_from + 1)
        if sentence.sent_id in seen:
            raise _fail(name, start + 1, f"sentence id {sentence.sent_id!r} was already used by the sentence "
                                         f"at line {seen[sentence.sent_id]}; give every sentence its own id")
        seen[sentence.sent_id] = start + 1
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


@dataclass
class _Row:
    line: int
    columns: list[str]
    id: int | tuple


def _parse_sentence(name: str, contents: list[str], start: int, stop: int, lines: tuple[str, ...],
                    first_line: int) -> Sentence:
    """One block of non-blank lines, contents[start:stop], into a Sentence."""
    metadata: dict[str, tuple[str, int]] = {}  # key -> (value, line)
    rows: list[_Row] = []
    for index in range(start, stop):
        line, content = index + 1, contents[index]
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

    # Words in order, and the surface tokens (form, first word, last word, line) to place in the text.
    words: list[tuple[int, str, str, int]] = []  # (id, form, upos, line)
    surface: list[tuple[str, int, int, int]] = []
    multiword = empty = 0
    covered_to = 0  # the last word id inside the current multiword token
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
            surface.append((form, first, last, row.line))
            covered_to = last
            multiword += 1
            continue
        if row.id != len(words) + 1:
            raise _fail(name, row.line, f"word ID {row.id} in sentence {sent_id!r} is out of order; word IDs "
                                        f"run 1, 2, 3, ... and this row should be {len(words) + 1}")
        upos = row.columns[_UPOS_COLUMN]
        if upos not in UPOS:
            raise _fail(name, row.line, f"unknown UPOS {upos!r} for word {row.id} {form!r}; the 4th column "
                                        f"takes one of the 17 UD tags: {' '.join(UPOS)}")
        words.append((row.id, form, upos, row.line))
        if row.id > covered_to:
            surface.append((form, row.id, row.id, row.line))
    if covered_to > len(words):
        raise _fail(name, rows[-1].line, f"sentence {sent_id!r} has a multiword token ending at word "
                                         f"{covered_to} but only {len(words)} words; add its words' rows")
    if not words:
        raise _fail(name, start + 1, f"sentence {sent_id!r} has no word rows (integer IDs)")

    # Place each surface token in the text, in order.
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
    return Sentence(
        sent_id=sent_id,
        text=text,
        words=tuple(Word(i, f, u, *ranges[i], line) for i, f, u, line in words),
        lines=lines,
        first_line=first_line,
        multiword=multiword,
        empty_nodes=empty,
    )


def render(sentences: Sequence[Sentence], predicted_upos: Sequence[Sequence[str]] | None = None) -> str:
    """The file the sentences were read from, with the UPOS column replaced by the predictions if given."""
    if predicted_upos is None:
        return "".join(s.render() for s in sentences)
    predicted_upos = list(predicted_upos)
    if len(predicted_upos) != len(sentences):
        raise TreebankError(f"{len(predicted_upos)} predicted sentences for {len(sentences)} sentences; "
                            "predict every sentence, in the file's order")
    return "".join(s.render(tags) for s, tags in zip(sentences, predicted_upos, strict=True))


def write_predictions(sentences: Sequence[Sentence], predicted_upos: Sequence[Sequence[str]],
                      path: str | os.PathLike) -> None:
    """Write the gold file with only the UPOS of its word rows replaced by the predictions (atomically)."""
    data = render(sentences, predicted_upos).encode("utf-8")
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
    return provenance.markdown_table(header, rows, "lrrrrrr")


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
    return provenance.markdown_table(["UPOS", *by_split], rows, "l" + "r" * len(by_split))


# ---------------------------------------------------------------------------------------------------------
# Fetching


local_path = files.local_path  # a plain path or file:// URL -> Path; a network URL -> None


def pinned(sha256: str | None) -> str | None:
    """A pinned SHA-256 in lowercase, or None when none is pinned ('' or None)."""
    try:
        return files.pinned(sha256)
    except ValueError as err:
        raise TreebankError(str(err)) from err


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    pinned: bool
    sentences: list[Sentence]


def fetch(source: str, dest: str | os.PathLike, sha256: str | None = None, timeout: float = 60.0) -> Fetched:
    """Download `source` (http(s) URL, file:// URL or path) to `dest`, check it, and read it.

    The bytes go to a temporary name beside `dest`, which gets them only when the SHA-256 matches the
    pin (if one is given) and the file reads as CoNLL-U; otherwise `dest` is left as it was. Without a
    pin, the returned hash is what the caller records.
    """
    expected = pinned(sha256)
    sentences: list[Sentence] = []

    def parse(tmp: Path) -> None:  # before the rename: a malformed file never reaches dest
        sentences.extend(read_conllu(tmp, name=source))

    try:
        actual = files.download(source, dest, expected, timeout=timeout, validate=parse)
    except files.DownloadError as err:
        raise TreebankError(str(err)) from err
    return Fetched(Path(dest), actual, expected is not None, sentences)


# ---------------------------------------------------------------------------------------------------------
# The synthetic treebank

# Word classes: (UPOS, words). A word listed twice is drawn twice as often. Words in several classes
# (run, light, can, ...) are the ambiguous ones; the templates decide which class a slot draws from.
CLASSES: dict[str, tuple[str, str]] = {
    "det": ("DET", "the the the a a this that every each another"),
    "dets": ("DET", "the the some these those"),
    "subj": ("PRON", "I you we they"),
    "subj3": ("PRON", "he she it"),
    "obj": ("PRON", "me him her us them"),
    # Noun slots outnumber verb slots about two to one, so the verb classes hold few words besides the
    # ambiguous ones: each ambiguous word is then about as often a verb as a noun.
    "noun": ("NOUN", "man dog book friend café "
                     "duck fish bank house water light record saw can run walk play work well back"),
    "nouns": ("NOUN", "men dogs books friends "
                      "ducks banks houses lights records walks runs plays works flies"),
    "adj": ("ADJ", "good old new great little long big small happy red hot cold fast fast light light"),
    "adv": ("ADV", "fast fast well well here now again back too"),
    "degree": ("ADV", "very very really so quite"),
    "verb": ("VERB", "see love run walk play record fish water house light duck bank work like"),
    "verb3": ("VERB", "sees loves runs walks plays records fishes waters houses lights ducks banks "
                      "works likes flies"),
    "verbi": ("VERB", "run walk play work fish duck swim"),
    "verbi3": ("VERB", "runs walks plays works fishes ducks flies swims"),
    "past": ("VERB", "saw saw saw knew took made found opened "
                     "ran walked played recorded watered lit ducked liked worked"),
    "participle": ("VERB", "seen taken found run walked played recorded worked watered lit"),
    "propn": ("PROPN", "John Mary London Paris Google Smith Chicago José Zürich Zoë"),
    "digits": ("NUM", "5 10 25 40 99 100"),
    "number": ("NUM", "two three five ten"),
    "year": ("NUM", "1984 1999 2010 2020"),
    "intj": ("INTJ", "oh yes hello wow please"),
    "cconj": ("CCONJ", "and and or but"),
    "sconj": ("SCONJ", "because if when while"),
    "adp": ("ADP", "in on at near from with"),
    "neg": ("", "don't can't cannot didn't won't"),      # multiword tokens, see CONTRACTIONS
    "neg3": ("", "doesn't can't cannot didn't won't"),
}

# Multiword tokens, split the way UD English treebanks split them.
CONTRACTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "don't": (("do", "AUX"), ("n't", "PART")),
    "doesn't": (("does", "AUX"), ("n't", "PART")),
    "didn't": (("did", "AUX"), ("n't", "PART")),
    "can't": (("ca", "AUX"), ("n't", "PART")),
    "won't": (("wo", "AUX"), ("n't", "PART")),
    "cannot": (("can", "AUX"), ("not", "PART")),
}

# Literal punctuation and symbols in templates.
FIXED = {".": "PUNCT", ",": "PUNCT", "!": "PUNCT", "?": "PUNCT", "(": "PUNCT", ")": "PUNCT",
         "$": "SYM", "%": "SYM"}
NO_SPACE_BEFORE = {".", ",", "!", "?", ")", "%", "'s"}
NO_SPACE_AFTER = {"(", "$"}

# A slot is a class name, a literal from FIXED, or `form/UPOS`.
TEMPLATES = (
    "det noun verb3 det noun .",
    "det adj noun verb3 dets nouns .",
    "subj verb det noun .",
    "subj verb dets nouns adp det noun .",
    "dets nouns verb det noun .",
    "subj might/AUX verb det noun .",
    "det noun verb3 .",
    "subj3 verb3 det noun cconj verb3 det noun .",
    "subj3 verb3 det adj noun .",
    "subj past det noun adp det noun .",
    "subj can/AUX verb det noun .",
    "subj3 will/AUX verb dets nouns .",
    "subj neg verb det noun .",
    "subj3 neg3 verb obj .",
    "det noun is/AUX adj .",
    "det noun was/AUX degree adj !",
    "dets nouns are/AUX adj .",
    "subj3 verbi3 adv .",
    "subj verbi like/ADP det noun .",
    "subj like/VERB dets nouns .",
    "subj3 likes/VERB det adj noun .",
    "subj3 said/VERB that/SCONJ subj past det noun .",
    "that/DET noun is/AUX adj .",
    "subj past that/PRON .",
    "subj want/VERB to/PART verb det noun .",
    "subj3 went/VERB to/ADP det noun .",
    "intj , subj past det noun !",
    "well/INTJ , subj3 verb3 det noun .",
    "subj3 past det noun well/ADV .",
    "subj paid/VERB $ digits for/ADP det noun .",
    "digits % of/ADP dets nouns are/AUX adj .",
    "propn went/VERB to/ADP propn in/ADP year .",
    "subj past det noun cconj subj3 past det noun .",
    "subj past det noun sconj subj3 verbi3 adv .",
    "subj past nouns , nouns , etc/X .",
    "can/AUX subj verb det noun ?",
    "det noun can/AUX verbi adv .",
    "subj3 opened/VERB det can/NOUN .",
    "time/NOUN flies/VERB like/ADP det noun .",
    "fruit/NOUN flies/NOUN like/VERB det noun .",
    "propn 's/PART noun is/AUX adj .",
    "subj3 's/AUX degree adj .",
    "det noun ( year ) was/AUX adj .",
    "subj past number nouns before/ADP det noun .",
    "subj past det noun before/SCONJ subj3 past det noun .",
    "there/PRON is/AUX det noun adp det noun .",
    "subj went/VERB there/ADV .",
    "subj3 has/AUX participle det noun .",
    "subj3 has/VERB det adj noun .",
    "det noun of/ADP det noun verbi3 adv .",
    "propn verbi3 adv ( number nouns ) .",
)

# Lemmas that the regular rules below do not give.
_LEMMAS = {
    ("saw", "VERB"): "see", ("seen", "VERB"): "see", ("knew", "VERB"): "know", ("took", "VERB"): "take",
    ("taken", "VERB"): "take", ("made", "VERB"): "make", ("found", "VERB"): "find", ("kept", "VERB"): "keep",
    ("ran", "VERB"): "run", ("lit", "VERB"): "light", ("went", "VERB"): "go", ("said", "VERB"): "say",
    ("paid", "VERB"): "pay", ("has", "VERB"): "have", ("has", "AUX"): "have", ("is", "AUX"): "be",
    ("was", "AUX"): "be", ("are", "AUX"): "be", ("'s", "AUX"): "be", ("n't", "PART"): "not",
    ("ca", "AUX"): "can", ("wo", "AUX"): "will", ("does", "AUX"): "do", ("did", "AUX"): "do",
    ("men", "NOUN"): "man", ("women", "NOUN"): "woman", ("i", "PRON"): "I", ("an", "DET"): "a",
    ("me", "PRON"): "I", ("him", "PRON"): "he", ("her", "PRON"): "she", ("us", "PRON"): "we",
    ("them", "PRON"): "they", ("fishes", "VERB"): "fish", ("liked", "VERB"): "like",
    ("those", "DET"): "that", ("these", "DET"): "this",
}

# A flat tree (see the module docstring): dependents of the root, by UPOS.
_DEPRELS = {"ADJ": "amod", "ADP": "case", "ADV": "advmod", "AUX": "aux", "CCONJ": "cc", "DET": "det",
            "INTJ": "discourse", "NOUN": "obj", "NUM": "nummod", "PART": "advmod", "PRON": "obj",
            "PROPN": "obl", "PUNCT": "punct", "SCONJ": "mark", "SYM": "dep", "VERB": "conj", "X": "dep"}


def _lemma(form: str, upos: str) -> str:
    low = form.lower()
    if (low, upos) in _LEMMAS:
        return _LEMMAS[(low, upos)]
    if upos == "PROPN":
        return form
    if upos == "VERB" and low.endswith("ed"):
        return low[:-2]
    if upos in ("VERB", "NOUN") and low.endswith("s") and len(low) > 3:
        if low.endswith("ies"):
            return low[:-3] + "y"
        if low.endswith(("shes", "ches")):
            return low[:-2]
        return low[:-1]
    return low


def _parse_slot(slot: str) -> tuple[str, tuple[str, ...]]:
    """(UPOS, candidate words) of a template slot."""
    if slot in CLASSES:
        upos, words = CLASSES[slot]
        return upos, tuple(words.split())
    if slot in FIXED:
        return FIXED[slot], (slot,)
    form, sep, upos = slot.rpartition("/")
    if not sep or upos not in UPOS:
        raise ValueError(f"template slot {slot!r} is not a class, a punctuation mark or form/UPOS")
    return upos, (form,)


_SLOTS = tuple(tuple(_parse_slot(s) for s in t.split()) for t in TEMPLATES)


def _draw(rng: np.random.Generator) -> list[tuple[str, str]]:
    """One sentence as surface tokens (form, UPOS); a multiword token has UPOS ''."""
    template = _SLOTS[int(rng.integers(len(_SLOTS)))]
    tokens = []
    for upos, words in template:
        form = words[int(rng.integers(len(words)))] if len(words) > 1 else words[0]
        tokens.append((form, upos))
    for i in range(len(tokens) - 1):  # a -> an before a vowel
        if tokens[i][0] == "a" and tokens[i + 1][0][0] in "aeiou":
            tokens[i] = ("an", tokens[i][1])
    form, upos = tokens[0]
    tokens[0] = (form[0].upper() + form[1:], upos)
    return tokens


def _sentence_conllu(sent_id: str, tokens: list[tuple[str, str]]) -> str:
    """A sentence in CoNLL-U: sent_id, text, rows with a flat tree and SpaceAfter=No where due."""
    text, rows, words = [], [], []  # words: (form, upos) of the syntactic words
    for k, (form, upos) in enumerate(tokens):
        last = k == len(tokens) - 1
        glued = not last and (form in NO_SPACE_AFTER or tokens[k + 1][0] in NO_SPACE_BEFORE)
        misc = "SpaceAfter=No" if glued else "_"
        text.append(form + ("" if glued or last else " "))
        if form.lower() in CONTRACTIONS:
            parts = list(CONTRACTIONS[form.lower()])
            parts[0] = (form[: len(parts[0][0])], parts[0][1])  # keep a capital of the surface form
            first = len(words) + 1
            rows.append((f"{first}-{first + len(parts) - 1}", form, None, misc))
            for part in parts:
                rows.append((len(words) + 1, *part, "_"))
                words.append(part)
        else:
            rows.append((len(words) + 1, form, upos, misc))
            words.append((form, upos))
    tags = [u for _, u in words]
    root = next((tags.index(t) for t in ("VERB", "ADJ", "NOUN") if t in tags), 0) + 1
    lines = [f"# sent_id = {sent_id}", f"# text = {''.join(text)}"]
    for row_id, form, upos, misc in rows:
        if upos is None:
            lines.append("\t".join([row_id, form] + ["_"] * 7 + [misc]))
            continue
        if row_id == root:
            head, deprel = 0, "root"
        else:
            head, deprel = root, _DEPRELS[upos]
            if upos in ("NOUN", "PRON", "PROPN") and row_id < root:
                deprel = "nsubj"
            if upos == "AUX" and tags[root - 1] != "VERB":
                deprel = "cop"
        lines.append("\t".join([str(row_id), form, _lemma(form, upos), upos, "_", "_", str(head), deprel,
                                "_", misc]))
    return "\n".join(lines) + "\n\n"


def synthesize(seed: int, sizes: dict[str, int] | None = None) -> dict[str, str]:
    """The synthetic treebank as CoNLL-U text per split; split k draws from SeedSequence([seed, k])."""
    sizes = dict(SIZES if sizes is None else sizes)
    out = {}
    for k, split in enumerate(SPLITS):
        if split not in sizes:
            continue
        if sizes[split] < 1:
            raise ValueError(f"split {split}: needs at least one sentence, got {sizes[split]}")
        rng = np.random.default_rng(np.random.SeedSequence([seed, k]))
        out[split] = "".join(_sentence_conllu(f"{split}-{i:05d}", _draw(rng))
                             for i in range(1, sizes[split] + 1))
    return out


def write_synthetic(out_dir: str | os.PathLike, seed: int, sizes: dict[str, int] | None = None
                    ) -> dict[str, Path]:
    """Write `<out_dir>/<split>.conllu` per split (each atomically); return split -> path."""
    out_dir = Path(out_dir)
    paths = {}
    for split, text in synthesize(seed, sizes).items():
        paths[split] = out_dir / f"{split}.conllu"
        with files.atomic_path(paths[split]) as tmp:
            tmp.write_bytes(text.encode("utf-8"))
    return paths


# ---------------------------------------------------------------------------------------------------------
# Commands


def _synthesize_main(args) -> int:
    sizes = {"train": args.train, "dev": args.dev, "test": args.test}
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        paths = write_synthetic(args.out_dir, args.seed, sizes)
        frag.outputs.extend(paths[s] for s in SPLITS)
        by_split = {split: read_conllu(paths[split]) for split in SPLITS}  # the reader EWT goes through
        frag.table("Splits", splits_table(by_split))
        frag.table("UPOS", upos_table(by_split))
        baseline = [(split, f"{100 * most_frequent_tag_accuracy(by_split['train'], by_split[split]):.2f}")
                    for split in ("dev", "test")]
        frag.table("Most-frequent-tag baseline (trained on train)",
                   provenance.markdown_table(["split", "UPOS accuracy %"], baseline, "lr"))
        frag.note(f"synthetic treebank: {len(TEMPLATES)} templates; split k of {list(SPLITS)} is drawn from "
                  f"numpy SeedSequence([{args.seed}, k]), so a split does not depend on the others' sizes")
        frag.note("the HEAD and DEPREL columns hold a flat tree (every word attached to the root): valid "
                  "for the UD evaluation script, not a real analysis; only UPOS is meant to be learned")
    words = sum(len(s.words) for v in by_split.values() for s in v)
    print(f"encoder-study treebank synthesize: {words} words in {args.out_dir}/{{{','.join(SPLITS)}}}.conllu")
    return 0


def _fetch_main(args) -> int:
    url = args.url or EWT_URL.format(split=args.split)
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        path = local_path(url)
        if path is not None:
            frag.inputs.append(path)
        fetched = fetch(url, args.out, args.sha256, timeout=args.timeout)
        frag.outputs.append(args.out)
        by_split = {args.split: fetched.sentences}
        frag.table("Split", splits_table(by_split))
        frag.table("UPOS", upos_table(by_split))
        if fetched.pinned:
            frag.note(f"{url}: SHA-256 {fetched.sha256} (pinned and checked)")
        else:
            frag.note(f"{url}: SHA-256 {fetched.sha256}: recorded on first download, not pinned; put it "
                      "in the config to make the next run check it")
    print(f"encoder-study treebank fetch: {url} -> {args.out} ({len(fetched.sentences)} sentences, "
          f"SHA-256 {fetched.sha256})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`encoder-study treebank synthesize ...` writes the synthetic treebank; `encoder-study treebank
    fetch ...` downloads one split of a UD treebank (default: English-EWT r2.18) and checks it."""
    import argparse

    parser = argparse.ArgumentParser(prog="encoder-study treebank", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("synthesize", help="write the synthetic treebank's train/dev/test CoNLL-U files")
    provenance.add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    for split in SPLITS:
        p.add_argument(f"--{split}", type=int, default=SIZES[split], help=f"sentences in {split}")
    p.add_argument("--out-dir", required=True, help="writes <out-dir>/{train,dev,test}.conllu")
    p = sub.add_parser("fetch", help="download one split (URL, file:// URL or path) and check it")
    provenance.add_arguments(p)
    p.add_argument("--split", required=True, choices=SPLITS)
    p.add_argument("--url", default="", help=f"default: {EWT_URL}")
    p.add_argument("--sha256", default="", help="pinned SHA-256; empty: record it instead")
    p.add_argument("--out", required=True, help="the local .conllu file to write")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without data, then give up")
    args = parser.parse_args(argv)
    try:
        return _synthesize_main(args) if args.action == "synthesize" else _fetch_main(args)
    except (ValueError, files.IntegrityError) as err:  # TreebankError is a ValueError
        print(f"encoder-study treebank {args.action}: error: {err}", file=sys.stderr)
        return 2

