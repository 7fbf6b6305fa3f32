"""Treebanks: the CoNLL-U reader and its errors, predictions written back, the synthetic treebank,
fetching on file:// URLs, and the command. Offline and fast."""

import hashlib
from collections import Counter, defaultdict

import conllu
import pytest

from conftest import runner
from encoder_study import cli, provenance
from encoder_study.core import files
from encoder_study.data import SPLITS, fetch
from encoder_study.data import conllu as treebank
from encoder_study.data import synthetic as generator
from encoder_study.encoders.tokens import Doc
from encoder_study.provenance.records import read_record
from encoder_study.recipes.tagging import command

T = "\t"
SIZES = {"train": 1500, "dev": 300, "test": 300}  # the config's default (treebank.sizes)


def row(*columns) -> str:
    """A word row from ID, FORM, UPOS and optionally MISC; the other columns are filled in."""
    wid, form, upos, *misc = columns
    head = "0" if wid == "1" else ("_" if "." in wid else "1")
    deprel = "root" if wid == "1" else "dep"
    return T.join([wid, form, form.lower(), upos, "_", "_", head, deprel, "_", misc[0] if misc else "_"])


def mwt(ids: str, form: str, misc: str = "_") -> str:
    return T.join([ids, form] + ["_"] * 7 + [misc])


# Two sentences: a multiword token whose words spell it (cannot), one whose words do not (del), an
# empty node, SpaceAfter=No, characters outside the BMP and combining-free accents.
GOLD = "\n".join([
    "# newdoc id = doc1",
    "# sent_id = s1",
    "# text = Zoë cannot see the café’s 🙂 sign.",
    row("1", "Zoë", "PROPN"),
    mwt("2-3", "cannot"),
    row("2", "can", "AUX"),
    row("3", "not", "PART"),
    row("4", "see", "VERB"),
    row("5", "the", "DET"),
    row("6", "café", "NOUN", "SpaceAfter=No"),
    row("7", "’s", "PART"),
    row("8", "🙂", "SYM"),
    row("9", "sign", "NOUN", "SpaceAfter=No"),
    row("10", ".", "PUNCT"),
    "",
    "# sent_id = s2",
    "# text = Fui del mercado a casa.",
    row("1", "Fui", "VERB"),
    mwt("2-3", "del"),
    row("2", "de", "ADP"),
    row("3", "el", "DET"),
    row("4", "mercado", "NOUN"),
    T.join(["4.1", "llegué", "llegar", "VERB", "_", "_", "_", "_", "1:conj", "_"]),
    row("5", "a", "ADP"),
    row("6", "casa", "NOUN", "SpaceAfter=No"),
    row("7", ".", "PUNCT"),
    "",
    "",
])


# --- reading ------------------------------------------------------------------------------------------

def test_reader_words_ranges_and_doc():
    s1, s2 = treebank.parse_conllu(GOLD)
    assert (s1.sent_id, s1.text) == ("s1", "Zoë cannot see the café’s 🙂 sign.")
    assert [w.form for w in s1.words] == ["Zoë", "can", "not", "see", "the", "café", "’s", "🙂", "sign", "."]
    assert s1.upos == ("PROPN", "AUX", "PART", "VERB", "DET", "NOUN", "PART", "SYM", "NOUN", "PUNCT")
    # Python str indices: the emoji is one character; can + not split the surface token "cannot".
    assert [(w.start, w.end) for w in s1.words] == [(0, 3), (4, 7), (7, 10), (11, 14), (15, 18), (19, 23),
                                                    (23, 25), (26, 27), (28, 32), (32, 33)]
    assert [w.line for w in s1.words] == [4, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert (s1.multiword, s1.empty_nodes) == (1, 0)
    doc = s1.doc()
    assert isinstance(doc, Doc) and doc.text == s1.text
    assert [doc.word(i) for i in range(len(doc.words))] == [w.form for w in s1.words]

    # de + el do not spell "del": both get the surface token's range. The empty node is no word.
    assert [w.form for w in s2.words] == ["Fui", "de", "el", "mercado", "a", "casa", "."]
    assert [(w.start, w.end) for w in s2.words] == [(0, 3), (4, 7), (4, 7), (8, 15), (16, 17), (18, 22),
                                                    (22, 23)]
    assert [w.id for w in s2.words] == list(range(1, 8))
    assert (s2.multiword, s2.empty_nodes) == (1, 1)
    assert s2.doc().word(1) == s2.doc().word(2) == "del"


def test_reader_keeps_every_byte():
    sentences = treebank.parse_conllu(GOLD)
    assert treebank.render(sentences) == GOLD
    assert treebank.render(sentences, [s.upos for s in sentences]) == GOLD
    # CRLF endings, a byte-order mark and blank lines before the first sentence survive too.
    odd = "\ufeff\r\n" + GOLD.replace("\n", "\r\n")
    again = treebank.parse_conllu(odd)
    assert treebank.render(again, [s.upos for s in again]) == odd
    assert [s.doc() for s in again] == [s.doc() for s in sentences]


def test_any_whitespace_may_separate_tokens():
    text = "# sent_id = w\n# text = 100\u00a0km  north\n" + "\n".join(
        [row("1", "100", "NUM"), row("2", "km", "NOUN"), row("3", "north", "ADV")]) + "\n\n"
    (sentence,) = treebank.parse_conllu(text)
    assert sentence.doc().words == ((0, 3), (4, 6), (8, 13))


def test_read_conllu_from_file_and_not_utf8(tmp_path):
    path = tmp_path / "gold.conllu"
    path.write_bytes(GOLD.encode("utf-8"))
    assert [s.sent_id for s in treebank.read_conllu(path)] == ["s1", "s2"]
    lines = GOLD.split("\n")
    lines[17] = lines[17].replace("Fui", "F\udcffi")
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape"))
    with pytest.raises(treebank.TreebankError, match=rf"^{path}:18: not UTF-8"):
        treebank.read_conllu(path)


# --- errors with their line ---------------------------------------------------------------------------

def _edit(line_number: int, new: str | None) -> str:
    """GOLD with one line (1-based) replaced, or removed when `new` is None."""
    lines = GOLD.split("\n")
    if new is None:
        del lines[line_number - 1]
    else:
        lines[line_number - 1] = new
    return "\n".join(lines)


@pytest.mark.parametrize("text, line, message", [
    (_edit(8, "4\tsee\tsee\tVERB\t_\t_\t1\tdep\t_"), 8, "9 tab-separated column(s), expected 10"),
    (_edit(8, "4 see\tsee\tVERB\t_\t_\t1\tdep\t_\t_"), 8, "9 tab-separated column(s), expected 10"),
    (_edit(9, row("5", "the", "DETERMINER")), 9, "unknown UPOS 'DETERMINER' for word 5 'the'"),
    (_edit(25, row("6", "casa", "noun", "SpaceAfter=No")), 25, "unknown UPOS 'noun'"),
    (_edit(3, "# text = Zoë cannot see a café’s 🙂 sign."), 9,
     "sentence 's1': the form 'the' cannot be placed in the # text (line 3) at character 15"),
    (_edit(5, mwt("2-3", "can't")), 5, "the form \"can't\" cannot be placed"),
    (_edit(17, "# text = Fui del mercado a casa. Y más."), 17, "the # text goes on after the last form"),
    (_edit(17, None), 16, "sentence 's2' (lines 16-25) has no '# text = ...' comment"),
    (_edit(17, "# text ="), 16, "has no '# text = ...' comment"),
    (_edit(16, None), 16, "has no '# sent_id = ...' comment"),
    (_edit(16, "# sent_id = s1"), 16, "sentence id 's1' was already used by the sentence at line 1"),
    (_edit(8, row("5", "see", "VERB")), 8, "word ID 5 in sentence 's1' is out of order"),
    (_edit(8, row("x", "see", "VERB")), 8, "bad ID 'x'"),
    (_edit(5, mwt("3-4", "cannot")), 5, "multiword token 3-4 in sentence 's1' does not start"),
    (_edit(15, "\n# a comment\n"), 16, "has comments but no word rows"),
    ("", 1, "the file holds no sentences"),
    ("\n\n  \n", 1, "the file holds no sentences"),
])
def test_errors_name_file_line_and_fix(text, line, message):
    with pytest.raises(treebank.TreebankError) as err:
        treebank.parse_conllu(text, name="gold.conllu")
    assert str(err.value).startswith(f"gold.conllu:{line}: ")
    assert message in str(err.value)


def _long(*tail: str, text: str = "") -> str:
    """Sentence 'a': words 1-13 (w1 ... w13) on lines 3-15, then `tail` from line 16."""
    rows = [row(str(i), f"w{i}", "NOUN") for i in range(1, 14)]
    words = " ".join(f"w{i}" for i in range(1, 14))
    return f"# sent_id = a\n# text = {words} {text}\n" + "\n".join(rows + list(tail)) + "\n\n"


@pytest.mark.parametrize("text, line, message", [
    # A range past the sentence's end, then another multiword token (was an IndexError).
    (_long(mwt("14-99", "x"), row("14", "x", "NOUN"), mwt("15-16", "yz"), row("15", "y", "NOUN"),
           row("16", "z", "NOUN"), text="x yz"), 16,
     "multiword token 14-99 in sentence 'a' runs to word 99, into the multiword token 15-16 of line 18"),
    (_long(mwt("14-99", "x"), row("14", "x", "NOUN"), text="x"), 16,
     "multiword token 14-99 in sentence 'a' ends at word 99, but the sentence has only 14 words"),
    # The range's own line, not the sentence's last row (line 18).
    (_long(mwt("14-16", "xy"), row("14", "x", "NOUN"), row("15", "y", "NOUN"), text="xy"), 16,
     "multiword token 14-16 in sentence 'a' ends at word 16, but the sentence has only 15 words"),
])
def test_multiword_ranges_past_the_end_name_their_own_line(text, line, message):
    with pytest.raises(treebank.TreebankError) as err:
        treebank.parse_conllu(text, name="gold.conllu")
    assert str(err.value).startswith(f"gold.conllu:{line}: {message}")


SIGN = row("9", "sign", "NOUN", "SpaceAfter=No")  # line 13 of GOLD


@pytest.mark.parametrize("text, line, message", [
    (GOLD.replace("\n", "\r"), 1, "the lines end in a carriage return (CR) alone (classic Mac OS line ends)"),
    ("\ufeff" + GOLD.replace("\n", "\r"), 1, "the lines end in a carriage return (CR) alone"),
    (_edit(8, row("4", "se\re", "VERB")), 8, "a carriage return (CR) that no line feed follows (character 5"),
    (_edit(13, SIGN + "\r").replace("\n", "\r\n"), 13,
     f"a carriage return (CR) that no line feed follows (character {len(SIGN) + 1} "),
    (_edit(8, row("4", "se\x00e", "VERB")), 8, "a NUL byte (character 5 of the line)"),
    (_edit(18, "# text = Fui del mercado a casa.\x00"), 18, "a NUL byte (character 33 of the line)"),
])
def test_carriage_returns_and_nul_bytes_name_their_line(text, line, message):
    with pytest.raises(treebank.TreebankError) as err:
        treebank.parse_conllu(text, name="gold.conllu")
    assert str(err.value).startswith(f"gold.conllu:{line}: {message}")


def test_nul_bytes_from_a_file_name_their_line(tmp_path):
    path = tmp_path / "gold.conllu"
    path.write_bytes(_edit(25, row("6", "ca\x00sa", "NOUN", "SpaceAfter=No")).encode("utf-8"))
    with pytest.raises(treebank.TreebankError, match=rf"^{path}:25: a NUL byte"):
        treebank.read_conllu(path)


def test_bad_heads_are_a_warning_of_the_summary():
    lines = GOLD.split("\n")
    lines[7] = lines[7].replace("\t1\tdep", "\t11\tdep")  # s1 has 10 words
    lines[8] = lines[8].replace("\t1\tdep", "\tx\tdep")
    lines[21] = lines[21].replace("\t1\tdep", "\t_\tdep")  # s2, word 4 (the empty node keeps its _)
    s1, s2 = treebank.parse_conllu("\n".join(lines))
    assert (s1.bad_heads, s2.bad_heads) == (((8, "11"), (9, "x")), ((22, "_"),))
    assert [s.upos for s in (s1, s2)] == [s.upos for s in treebank.parse_conllu(GOLD)]  # only a warning
    table = treebank.splits_table({"train": [s1, s2], "dev": treebank.parse_conllu(GOLD)})
    good = treebank.splits_table({"train": treebank.parse_conllu(GOLD), "dev": treebank.parse_conllu(GOLD)})
    assert table.startswith(good.split("| train")[0]) and "Warning" not in good
    assert table.split("\n\n")[1] == (
        "Warning: train: 3 word row(s) with a HEAD that is not a number or not a word of their sentence (the "
        "first: line 8, sentence 's1', HEAD '11'); only UPOS is read, so no score changes, but the file is "
        "not valid CoNLL-U.\n")
    assert all(not s.bad_heads for s in treebank.parse_conllu(GOLD))


def test_every_upos_is_accepted_and_the_list_is_the_ud_one():
    assert len(treebank.UPOS) == 17 and len(set(treebank.UPOS)) == 17
    rows = [row(str(i), f"w{i}", tag) for i, tag in enumerate(treebank.UPOS, 1)]
    words = " ".join(f"w{i}" for i in range(1, 18))
    text = f"# sent_id = a\n# text = {words}\n" + "\n".join(rows) + "\n\n"
    assert treebank.parse_conllu(text)[0].upos == treebank.UPOS


# --- predictions --------------------------------------------------------------------------------------

def _surface(text: str) -> str:
    """The concatenated surface tokens (multiword tokens, words outside them) the eval script compares."""
    out, covered = [], 0
    for line in text.split("\n"):
        columns = line.rstrip("\r").split("\t")
        if len(columns) != 10 or "." in columns[0]:
            if not line:
                covered = 0
            continue
        if "-" in columns[0]:
            out.append(columns[1])
            covered = int(columns[0].split("-")[1])
        elif int(columns[0]) > covered:
            out.append(columns[1])
    return "".join(out)


def test_predictions_change_only_the_upos_column(tmp_path):
    sentences = treebank.parse_conllu(GOLD)
    predicted = [["X"] * len(s.words) for s in sentences]
    predicted[0][3] = "NOUN"
    path = tmp_path / "run" / "test.pred.conllu"
    treebank.write_predictions(sentences, predicted, path)
    gold_lines, pred_lines = GOLD.encode().split(b"\n"), path.read_bytes().split(b"\n")
    assert len(gold_lines) == len(pred_lines)
    changed = 0
    for g, p in zip(gold_lines, pred_lines, strict=True):
        if g == p:
            continue
        gc, pc = g.split(b"\t"), p.split(b"\t")
        assert len(gc) == len(pc) == 10 and gc[0].isdigit()
        assert gc[:3] + gc[4:] == pc[:3] + pc[4:] and gc[3] != pc[3]
        changed += 1
    assert changed == sum(len(s.words) for s in sentences)  # no gold tag is X
    # The result reads back, with our reader and with the conllu package, with the predicted tags.
    again = treebank.read_conllu(path)
    assert [list(s.upos) for s in again] == predicted
    parsed = conllu.parse(path.read_text(encoding="utf-8"))
    assert [[t["upos"] for t in s if isinstance(t["id"], int)] for s in parsed] == predicted
    assert parsed[0].metadata["text"] == sentences[0].text
    # What the UD evaluation script checks: same surface characters, a well-formed file.
    assert _surface(path.read_text(encoding="utf-8")) == _surface(GOLD)
    _ud_eval_tree(path.read_text(encoding="utf-8"))


def _ud_eval_tree(text: str) -> None:
    """The checks of conll18_ud_eval.py's load_conllu: 10 tab-separated columns, word IDs 1, 2, ...,
    integer HEADs inside the sentence forming one tree with one root, an empty line after every sentence."""
    heads: dict[int, int] = {}
    in_sentence = False
    assert text.endswith("\n")
    for line in text.split("\n")[:-1]:
        line = line.rstrip("\r")
        if not in_sentence and line.startswith("#"):
            continue
        in_sentence = True
        if not line:
            assert sum(h == 0 for h in heads.values()) == 1, "one root"
            for start in heads:
                seen, node = set(), start
                while node:
                    assert node not in seen and 0 <= heads[node] <= len(heads), "no cycle, heads inside"
                    seen.add(node)
                    node = heads[node]
            heads, in_sentence = {}, False
            continue
        columns = line.split("\t")
        assert len(columns) == 10
        if "." in columns[0] or "-" in columns[0]:
            continue
        assert int(columns[0]) == len(heads) + 1
        heads[int(columns[0])] = int(columns[6])
    assert not in_sentence, "the file ends with an empty line"


def test_predictions_are_checked():
    sentences = treebank.parse_conllu(GOLD)
    with pytest.raises(treebank.TreebankError, match="sentence 's2': 6 predicted tags for 7 words"):
        treebank.render(sentences, [sentences[0].upos, sentences[1].upos[:-1]])
    with pytest.raises(treebank.TreebankError, match="'VB' is not a UD UPOS tag"):
        treebank.render(sentences, [sentences[0].upos, ("VB",) * 7])
    with pytest.raises(treebank.TreebankError, match="1 predicted sentences for 2"):
        treebank.render(sentences, [sentences[0].upos])


# --- the synthetic treebank ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic():
    """The default-sized synthetic treebank (seed 0): split -> (text, sentences)."""
    texts = generator.synthesize(0, SIZES)
    return {split: (text, treebank.parse_conllu(text, split)) for split, text in texts.items()}


def test_synthetic_is_deterministic_and_splits_are_independent():
    sizes = {"train": 30, "dev": 10, "test": 20}
    first = generator.synthesize(7, sizes)
    assert first == generator.synthesize(7, sizes)
    other = generator.synthesize(8, sizes)
    assert all(first[s] != other[s] for s in SPLITS)
    assert len({first[s] for s in SPLITS}) == 3
    # A split's sentences do not depend on the sizes of the others.
    assert generator.synthesize(7, {"train": 99, "dev": 1, "test": 20})["test"] == first["test"]
    with pytest.raises(ValueError, match="at least one sentence"):
        generator.synthesize(7, {"train": 0})


def test_synthetic_sizes_tags_and_features(synthetic):
    assert {s: len(v[1]) for s, v in synthetic.items()} == SIZES
    train = synthetic["train"][1]
    for split, (text, sentences) in synthetic.items():
        assert set(treebank.upos_counts(sentences)) == set(treebank.UPOS), split
        assert sum(s.multiword for s in sentences) > 0
        assert "SpaceAfter=No" in text and "\n# sent_id = " in text and "\n# text = " in text
        assert treebank.render(sentences) == text
        _ud_eval_tree(text)
    # Every sentence's words are placed in its text, and the text has the punctuation glued on.
    assert all(s.text.endswith((".", "!", "?")) and " ." not in s.text for s in train)
    assert any("n't" in s.text for s in train) and any(w.form == "n't" for s in train for w in s.words)
    tags_of = defaultdict(set)
    for s in train:
        for w in s.words:
            tags_of[w.form].add(w.upos)
    ambiguous = ("run walk play record light fast can saw duck fish bank house water works flies like "
                 "that to").split()
    assert {w: len(tags_of[w]) for w in ambiguous} == {w: max(2, len(tags_of[w])) for w in ambiguous}
    assert tags_of["light"] == {"NOUN", "VERB", "ADJ"} and tags_of["can"] == {"NOUN", "AUX"}


def test_synthetic_needs_context(synthetic):
    """A most-frequent-tag baseline is well below 100%; a tagger that sees the neighbours does much better."""
    train, test = synthetic["train"][1], synthetic["test"][1]

    def context(s, i):
        forms = ["<s>"] + [w.form for w in s.words] + ["</s>"]
        return forms[i], forms[i + 1], forms[i + 2]

    unigram, bigram, trigram = defaultdict(Counter), defaultdict(Counter), defaultdict(Counter)
    for s in train:
        for i, w in enumerate(s.words):
            c = context(s, i)
            unigram[c[1]][w.upos] += 1
            bigram[c[:2]][w.upos] += 1
            trigram[c][w.upos] += 1

    def best(*counters: Counter) -> str:  # the first counter that saw the context decides
        return next((c for c in counters if c), Counter(NOUN=1)).most_common(1)[0][0]

    gold = [(context(s, i), w.upos) for s in test for i, w in enumerate(s.words)]
    none = Counter()
    baseline = sum(best(unigram.get(c[1], none)) == tag for c, tag in gold) / len(gold)
    in_context = sum(best(trigram.get(c, none), bigram.get(c[:2], none), unigram.get(c[1], none)) == tag
                     for c, tag in gold) / len(gold)
    assert 0.75 < baseline < 0.92
    assert in_context > max(0.95, baseline + 0.06)
    assert treebank.most_frequent_tag_accuracy(train, test) == pytest.approx(baseline, abs=0.005)


# --- fetching -----------------------------------------------------------------------------------------

def test_fetch_file_url_with_right_wrong_and_no_hash(tmp_path):
    source = tmp_path / "src" / "en_ewt-ud-dev.conllu"
    source.parent.mkdir()
    source.write_bytes(GOLD.encode("utf-8"))
    digest = hashlib.sha256(GOLD.encode("utf-8")).hexdigest()
    out = tmp_path / "treebank" / "dev.conllu"

    got = fetch.treebank(source.as_uri(), out, digest.upper())
    assert (got.sha256, got.pinned, len(got.sentences)) == (digest, True, 2)
    assert out.read_bytes() == source.read_bytes()

    out.write_bytes(b"before")
    with pytest.raises(files.IntegrityError) as err:
        fetch.treebank(source.as_uri(), out, "0" * 64)
    assert digest in str(err.value) and "0" * 64 in str(err.value)
    assert out.read_bytes() == b"before"  # left as it was, no temporary file beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["dev.conllu"]

    got = fetch.treebank(str(source), out, "")  # a plain path, nothing pinned: the hash is recorded
    assert (got.sha256, got.pinned) == (digest, False) and out.read_bytes() == source.read_bytes()


def test_fetch_refuses_bad_files_pins_and_sources(tmp_path):
    bad = tmp_path / "bad.conllu"
    bad.write_text(_edit(9, row("5", "the", "DT")), encoding="utf-8")
    out = tmp_path / "out.conllu"
    with pytest.raises(treebank.TreebankError, match=rf"^{bad.as_uri()}:9: unknown UPOS 'DT'"):
        fetch.treebank(bad.as_uri(), out)
    assert not out.exists()
    with pytest.raises(treebank.TreebankError, match="not a SHA-256"):
        fetch.treebank(bad.as_uri(), out, "abc")
    with pytest.raises(treebank.TreebankError, match="no such file"):
        fetch.treebank((tmp_path / "missing.conllu").as_uri(), out)


# --- the command --------------------------------------------------------------------------------------

run = runner("tagging")


def test_treebank_command_writes_files_and_fragment(tmp_path, capsys):
    out_dir = tmp_path / "results" / "treebank"
    frag = tmp_path / "provenance" / "tagging" / "tagging_treebank.md"
    assert run("treebank", "--seed", "3", "--train", "60", "--dev", "20", "--test", "25",
               "--out-dir", str(out_dir), "--provenance", str(frag)) == 0
    expected = generator.synthesize(3, {"train": 60, "dev": 20, "test": 25})
    for split in SPLITS:
        assert (out_dir / f"{split}.conllu").read_text(encoding="utf-8") == expected[split]
    body = frag.read_text(encoding="utf-8")
    rows = read_record(provenance.twin(frag))["files"]
    assert [(r["role"], r["path"]) for r in rows] == [("output", (out_dir / f"{s}.conllu").as_posix())
                                                      for s in SPLITS]
    assert all(r["sha256"] == files.sha256_file(r["path"]) for r in rows)
    assert "## Splits" in body and "| train | 60 |" in body and "multiword tokens" in body
    assert "Warning" not in body  # the synthetic HEADs are a flat tree of word numbers
    assert "## UPOS" in body and "| PROPN |" in body and "Most-frequent-tag baseline" in body
    assert "| seed | 3 |" in body
    assert "tagging treebank" in capsys.readouterr().out
    assert cli.COMMANDS["tagging"] == command.__name__


def test_fetch_command_records_or_checks_the_hash(tmp_path, capsys):
    source = tmp_path / "en_ewt-ud-train.conllu"
    source.write_bytes(GOLD.encode("utf-8"))
    digest = files.sha256_file(source)
    out = tmp_path / "results" / "train.conllu"
    frag = tmp_path / "provenance" / "tagging" / "tagging_fetch-train.md"

    def fetch(sha256: str) -> int:
        return run("fetch", "--split", "train", "--url", source.as_uri(), "--sha256", sha256,
                   "--timeout", "60", "--out", str(out), "--provenance", str(frag))

    assert fetch("") == 0
    body = frag.read_text(encoding="utf-8")
    assert f"SHA-256 {digest}: recorded on first download, not pinned" in body
    assert "| train | 2 | 17 | 2 | 1 |" in body  # sentences, words, multiword tokens, empty nodes
    rows = read_record(provenance.twin(frag))["files"]
    assert [(r["role"], r["path"]) for r in rows] == [("input", source.as_posix()),
                                                      ("output", out.as_posix())]
    assert fetch(digest) == 0 and f"SHA-256 {digest} (pinned and checked)" in frag.read_text(encoding="utf-8")
    frag.unlink()
    with pytest.raises(files.IntegrityError, match="does not match"):  # cli: one line, exit status 2
        fetch("1" * 64)
    assert not frag.exists()


def test_the_out_of_domain_set_is_deterministic_other_words_and_reads_back(tmp_path):
    text = generator.synthesize_ood(0, 200)
    assert text == generator.synthesize_ood(0, 200)  # seeded: the same bytes every time
    assert text != generator.synthesize_ood(1, 200)
    assert text.startswith(generator.synthesize_ood(0, 50))  # more sentences add to the end
    path = generator.write_ood(tmp_path / "ood.conllu", 0, 200)
    sentences = treebank.read_conllu(path)  # through the reader EWT goes through
    assert len(sentences) == 200 and sentences[0].sent_id == "ood-00001"
    assert {t for s in sentences for t in s.upos} <= set(treebank.UPOS)
    # Out of domain: many of its words never occur in the default treebank's train split.
    seen = {w.form for s in treebank.read_conllu(generator.write_synthetic(tmp_path, 0, SIZES)["train"])
            for w in s.words}
    words = [w.form for s in sentences for w in s.words]
    unseen = sum(form not in seen for form in words) / len(words)
    assert unseen > 0.4, unseen
    # ... while the treebank's own test split is mostly seen words (the contrast the set is for).
    test_words = [w.form for s in treebank.read_conllu(tmp_path / "test.conllu") for w in s.words]
    assert sum(form not in seen for form in test_words) / len(test_words) < unseen / 2
    with pytest.raises(treebank.TreebankError, match="at least one sentence"):
        generator.synthesize_ood(0, 0)


def test_the_ood_command_writes_the_set_and_its_fragment(tmp_path):
    out, prov = tmp_path / "pud-like.conllu", tmp_path / "tagging_ood-x.md"
    args = command.parser().parse_args(["ood", "--name", "x", "--seed", "0", "--sentences", "12", "--out",
                                        str(out), "--provenance", str(prov)])
    assert args.run(args) == 0
    assert out.read_text(encoding="utf-8") == generator.synthesize_ood(0, 12, "x")
    assert files.sha256_file(out) in prov.read_text(encoding="utf-8")
