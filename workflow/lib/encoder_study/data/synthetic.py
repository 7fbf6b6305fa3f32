"""The synthetic treebank of the embedded default.

Sentences are drawn from templates (`TEMPLATES`) over word classes (`CLASSES`) with a seeded numpy
Generator, one independent stream per split, so the test split does not change when the train size
does. Many common words take different tags in different templates (`run` is a NOUN after a
determiner and a VERB after a pronoun or `can`), so a most-frequent-tag baseline stays clearly below
100% while a tagger that reads the context can do much better. The files use every UD feature the
reader handles (multiword tokens, `SpaceAfter=No`, sentence ids, `# text`, Unicode names) and are
read back through the same code as EWT. The dependency columns hold a flat tree (every word attached
to one root), valid for the evaluation script but not a real analysis: only UPOS and XPOS are meant to
be learned. XPOS holds Penn Treebank tags, as EWT's does (`_xpos`): a word class's (NN, NNS, VBZ, VBD,
...), a literal's own, and a verb's base form VB after a modal, `to` or a negation or at the start of
a sentence, else VBP; it is derived from what was drawn, so the UPOS draws are those of a treebank
without it.
"""


from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..core import files
from . import SPLITS
from .conllu import UPOS, TreebankError

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
    # the out-of-domain set's
    ("were", "AUX"): "be", ("replaced", "VERB"): "replace", ("prescribed", "VERB"): "prescribe",
    ("updated", "VERB"): "update", ("invoices", "VERB"): "invoice", ("replaces", "VERB"): "replace",
    ("prescribes", "VERB"): "prescribe", ("updates", "VERB"): "update", ("patches", "VERB"): "patch",
    ("patches", "NOUN"): "patch", ("invoices", "NOUN"): "invoice",
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


def _parse_slot(slot: str, classes: dict[str, tuple[str, str]] = CLASSES
                ) -> tuple[str, tuple[str, ...], str | None]:
    """(UPOS, candidate words, class name or None) of a template slot over the word classes `classes`."""
    if slot in classes:
        upos, words = classes[slot]
        return upos, tuple(words.split()), slot
    if slot in FIXED:
        return FIXED[slot], (slot,), None
    form, sep, upos = slot.rpartition("/")
    if not sep or upos not in UPOS:
        raise ValueError(f"template slot {slot!r} is not a class, a punctuation mark or form/UPOS")
    return upos, (form,), None


# Penn Treebank tags (XPOS), as UD English-EWT gives them: by word class, else by (form, UPOS), the
# literals written form/UPOS/XPOS.
# "VB?" is a verb's base form: VB or VBP by context (`_xpos`).
CLASS_XPOS = {"det": "DT", "dets": "DT", "subj": "PRP", "subj3": "PRP", "obj": "PRP", "noun": "NN",
              "nouns": "NNS", "adj": "JJ", "adv": "RB", "degree": "RB", "verb": "VB?", "verbi": "VB?",
              "verb3": "VBZ", "verbi3": "VBZ", "past": "VBD", "participle": "VBN", "propn": "NNP",
              "digits": "CD", "number": "CD", "year": "CD", "intj": "UH", "cconj": "CC", "sconj": "IN",
              "adp": "IN"}
WORD_XPOS = {(form, upos): xpos for form, upos, xpos in (entry.split("/") for entry in """
    ./PUNCT/. !/PUNCT/. ?/PUNCT/. ,/PUNCT/, (/PUNCT/-LRB- )/PUNCT/-RRB- $/SYM/$ %/SYM/NN might/AUX/MD
    can/AUX/MD will/AUX/MD must/AUX/MD should/AUX/MD ca/AUX/MD wo/AUX/MD is/AUX/VBZ 's/AUX/VBZ
    has/AUX/VBZ was/AUX/VBD are/AUX/VBP were/AUX/VBD be/AUX/VB do/AUX/VBP does/AUX/VBZ did/AUX/VBD
    n't/PART/RB not/PART/RB to/PART/TO 's/PART/POS to/ADP/IN like/ADP/IN like/VERB/VB? likes/VERB/VBZ
    said/VERB/VBD went/VERB/VBD paid/VERB/VBD opened/VERB/VBD want/VERB/VB? has/VERB/VBZ flies/VERB/VBZ
    flies/NOUN/NNS can/NOUN/NN time/NOUN/NN fruit/NOUN/NN that/SCONJ/IN that/DET/DT that/PRON/DT
    the/DET/DT there/PRON/EX there/ADV/RB well/INTJ/UH well/ADV/RB why/ADV/WRB then/ADV/RB
    please/INTJ/UH etc/X/FW for/ADP/IN of/ADP/IN in/ADP/IN before/ADP/IN before/SCONJ/IN
""".split())}


def _xpos(form: str, upos: str, kind: str | None, before: list[tuple[str, str]]) -> str:
    """The Penn Treebank tag of a word drawn from class `kind` (None: a literal or a contraction's
    part), after the words `before` it in the sentence ((form, UPOS) pairs)."""
    tag = CLASS_XPOS.get(kind) if kind is not None else WORD_XPOS.get((form.lower(), upos))
    if tag is None:
        raise ValueError(f"no XPOS for {form!r} ({upos}, class {kind}); add it to synthetic.WORD_XPOS")
    if tag == "VB?":  # a base form: infinitive after a modal, do-support, `to` or a negation, or imperative
        governed = not before or any(u == "AUX" or (f.lower() == "to" and u == "PART") for f, u in before)
        tag = "VB" if governed else "VBP"
    return tag


_SLOTS = tuple(tuple(_parse_slot(s) for s in t.split()) for t in TEMPLATES)


def _draw(rng: np.random.Generator, slots=_SLOTS) -> list[tuple[str, str, str | None]]:
    """One sentence of a template of `slots` as surface tokens (form, UPOS, class); a multiword token has
    UPOS ''."""
    template = slots[int(rng.integers(len(slots)))]
    tokens = []
    for upos, words, kind in template:
        form = words[int(rng.integers(len(words)))] if len(words) > 1 else words[0]
        tokens.append((form, upos, kind))
    for i in range(len(tokens) - 1):  # a -> an before a vowel
        if tokens[i][0] == "a" and tokens[i + 1][0][0] in "aeiou":
            tokens[i] = ("an", *tokens[i][1:])
    form, upos, kind = tokens[0]
    tokens[0] = (form[0].upper() + form[1:], upos, kind)
    return tokens


def _sentence_conllu(sent_id: str, tokens: list[tuple[str, str, str | None]]) -> str:
    """A sentence in CoNLL-U: sent_id, text, rows with a flat tree and SpaceAfter=No where due."""
    text, rows, words = [], [], []  # words: (form, upos) of the syntactic words
    for k, (form, upos, kind) in enumerate(tokens):
        last = k == len(tokens) - 1
        glued = not last and (form in NO_SPACE_AFTER or tokens[k + 1][0] in NO_SPACE_BEFORE)
        misc = "SpaceAfter=No" if glued else "_"
        text.append(form + ("" if glued or last else " "))
        if form.lower() in CONTRACTIONS:
            parts = list(CONTRACTIONS[form.lower()])
            parts[0] = (form[: len(parts[0][0])], parts[0][1])  # keep a capital of the surface form
            first = len(words) + 1
            rows.append((f"{first}-{first + len(parts) - 1}", form, None, None, misc))
            for part in parts:
                rows.append((len(words) + 1, *part, _xpos(*part, None, words), "_"))
                words.append(part)
        else:
            rows.append((len(words) + 1, form, upos, _xpos(form, upos, kind, words), misc))
            words.append((form, upos))
    tags = [u for _, u in words]
    root = next((tags.index(t) for t in ("VERB", "ADJ", "NOUN") if t in tags), 0) + 1
    lines = [f"# sent_id = {sent_id}", f"# text = {''.join(text)}"]
    for row_id, form, upos, xpos, misc in rows:
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
        lines.append("\t".join([str(row_id), form, _lemma(form, upos), upos, xpos, "_", str(head), deprel,
                                "_", misc]))
    return "\n".join(lines) + "\n\n"


def synthesize(seed: int, sizes: dict[str, int]) -> dict[str, str]:
    """The synthetic treebank as CoNLL-U text per split in `sizes` (sentences per split; the workflow's
    come from the config, treebank.sizes); split k draws from SeedSequence([seed, k])."""
    out = {}
    for k, split in enumerate(SPLITS):
        if split not in sizes:
            continue
        if sizes[split] < 1:
            raise TreebankError(f"split {split}: needs at least one sentence, got {sizes[split]}")
        rng = np.random.default_rng(np.random.SeedSequence([seed, k]))
        out[split] = "".join(_sentence_conllu(f"{split}-{i:05d}", _draw(rng))
                             for i in range(1, sizes[split] + 1))
    return out


def write_synthetic(out_dir: str | os.PathLike, seed: int, sizes: dict[str, int]) -> dict[str, Path]:
    """Write `<out_dir>/<split>.conllu` per split (each atomically); return split -> path."""
    out_dir = Path(out_dir)
    paths = {}
    for split, text in synthesize(seed, sizes).items():
        paths[split] = out_dir / f"{split}.conllu"
        with files.atomic_path(paths[split]) as tmp:
            tmp.write_bytes(text.encode("utf-8"))
    return paths


# -- the out-of-domain test set ------------------------------------------------------------------------
# Another register (instructions, clinical and technical notes, questions) with its own word lists and
# templates: most content words never occur in the treebank above, so a tagger must fall back on spelling
# and context. Function words are shared, as they would be between two English domains. Tagged by the
# same conventions (UD English), written by the same code.
OOD_CLASSES: dict[str, tuple[str, str]] = {
    "det": ("DET", "the the a this each"),
    "dets": ("DET", "the these all"),
    "subj": ("PRON", "I you we they"),
    "noun": ("NOUN", "patient nurse dose tablet symptom clinic valve sensor cable router server kernel "
                     "patch ticket invoice tenant landlord harvest tractor glacier"),
    "nouns": ("NOUN", "patients nurses doses tablets symptoms valves sensors cables routers servers "
                      "kernels patches tickets invoices tenants harvests tractors glaciers"),
    "adj": ("ADJ", "chronic acute faulty wireless overdue fragile humid remote stale urgent"),
    "adv": ("ADV", "carefully twice daily slowly promptly remotely"),
    "verb": ("VERB", "install reboot prescribe inspect replace monitor invoice patch harvest update"),
    "verb3": ("VERB", "installs reboots prescribes inspects replaces monitors invoices patches harvests "
                      "updates"),
    "past": ("VERB", "installed rebooted prescribed inspected replaced monitored patched harvested updated"),
    "participle": ("VERB", "installed rebooted prescribed inspected replaced monitored patched updated"),
    "propn": ("PROPN", "Oslo Nairobi Debian Kubernetes Okafor Lindqvist Medtronic Bjørn"),
    "digits": ("NUM", "3 12 48 250 1024"),
    "adp": ("ADP", "in on after during via under"),
    "cconj": ("CCONJ", "and or"),
    "sconj": ("SCONJ", "because if until"),
    "neg": ("", "don't didn't"),      # multiword tokens, see CONTRACTIONS
}

OOD_TEMPLATES = (
    "verb det noun adv .",
    "please/INTJ verb det adj noun before/ADP det noun .",
    "det noun must/AUX be/AUX participle adv .",
    "propn past det adj noun adp propn .",
    "did/AUX subj verb dets nouns ?",
    "subj should/AUX verb det noun sconj det noun is/AUX adj .",
    "dets adj nouns were/AUX participle adp digits nouns .",
    "the/DET noun verb3 det noun adp det adj noun .",
    "why/ADV is/AUX det noun adj ?",
    "propn verb3 nouns cconj nouns adv .",
    "subj past digits nouns , then/ADV past det noun .",
    "neg verb det noun !",
)

_OOD_SLOTS = tuple(tuple(_parse_slot(s, OOD_CLASSES) for s in t.split()) for t in OOD_TEMPLATES)
# Its own stream: SeedSequence([seed, OOD_STREAM]) is none of the splits' ([seed, k], k < 3).
OOD_STREAM = 1000


def synthesize_ood(seed: int, sentences: int, name: str = "ood") -> str:
    """The out-of-domain test set as CoNLL-U text: `sentences` sentences from `OOD_TEMPLATES` over
    `OOD_CLASSES`, ids `<name>-00001`..., drawn from SeedSequence([seed, OOD_STREAM])."""
    if sentences < 1:
        raise TreebankError(f"extra test set {name}: needs at least one sentence, got {sentences}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, OOD_STREAM]))
    return "".join(_sentence_conllu(f"{name}-{i:05d}", _draw(rng, _OOD_SLOTS))
                   for i in range(1, sentences + 1))


def write_ood(path: str | os.PathLike, seed: int, sentences: int, name: str = "ood") -> Path:
    """Write the out-of-domain test set to `path` (atomically)."""
    path = Path(path)
    text = synthesize_ood(seed, sentences, name)
    with files.atomic_path(path) as tmp:
        tmp.write_bytes(text.encode("utf-8"))
    return path
