"""The validation cases: fixed texts, tokenised and right-padded as a consumer would batch them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...encoders.families import usable_positions
from ...onnx import runtime
from . import RetrievalError


@dataclass
class Case:
    name: str
    purpose: str
    texts: list[str]
    input_ids: np.ndarray
    attention_mask: np.ndarray


ENGLISH = ("The committee met on Tuesday to review the budget, and most members agreed that the bank of "
           "the river needs work before the winter floods arrive.")
LANGUAGES = [
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",                 # Czech: Latin with diacritics
    "Съешь же ещё этих мягких французских булок.",            # Russian: Cyrillic
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",                      # Greek
    "שלום לכולם, מה שלומכם היום?",                               # Hebrew: right to left
    "مرحبا بالجميع، كيف حالكم اليوم؟",                          # Arabic: right to left, joined letters
    "नमस्ते, आज मौसम बहुत अच्छा है।",                                   # Hindi: Devanagari
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",                                 # Thai: no spaces between words
    "日本語の文字と한국어 문장",                                  # Japanese and Korean
]
REPEATED = ("the bank is a bank, the house is a house, the duck is a duck, and the river bank runs "
            "into the river")
UNKNOWN = "Symbols such as ☃ ⌘ ♞ and 🙂🚀 are rare in any vocabulary."
BATCH = [
    "A short one.",
    "The second sentence of the batch is a good deal longer than the first, with many more pieces.",
    "Third.",
    "Padding changes results in ways that single inputs never show, so a batch is checked as well.",
]


def _encode(tokenizer, texts: list[str], max_length: int, pad_id: int, pad_to: int = 0
            ) -> tuple[np.ndarray, np.ndarray]:
    tokenizer.enable_truncation(max_length=max_length)
    rows = [tokenizer.encode(t).ids for t in texts]
    return runtime.pad_batch(rows, pad_id, pad_to)


def max_length(config) -> int:
    """The most pieces one text may have (texts are truncated to it): the model's usable positions."""
    return usable_positions(config.to_dict()) or 512


def parity_cases(tokenizer_path: str | os.PathLike, config) -> list[Case]:
    """The validation cases: each a right-padded batch of the model's tokenizer.json pieces, which the
    graph and the project's reference run (FlagEmbedding tokenises the texts itself)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    longest = max_length(config)
    pad = config.pad_token_id if config.pad_token_id is not None else 0

    def make(name: str, purpose: str, texts: list[str], pad_to: int = 0) -> Case:
        ids, mask = _encode(tokenizer, texts, longest, pad, pad_to)
        return Case(name, purpose, texts, ids, mask)

    tokenizer.no_truncation()
    paragraph = " ".join([ENGLISH, *LANGUAGES, REPEATED]) + " "
    per_copy = max(1, len(tokenizer.encode(paragraph).ids) - 2)
    long_text = paragraph * (longest // per_copy + 2)
    english_ids = len(tokenizer.encode(ENGLISH).ids)
    cases = [
        make("english", "ordinary English", [ENGLISH]),
        make("short", "a one-word text", ["Yes"]),
        make("empty", "an empty text: only the special tokens", [""]),
        make("long", f"the model's maximum length ({longest} pieces)", [long_text]),
        make("multilingual", f"{len(LANGUAGES)} languages in several scripts, one padded batch", LANGUAGES),
        make("repeated", "repeated pieces: one weight per id, the largest (max reduction)", [REPEATED]),
        make("unknown", "characters a vocabulary may lack (unknown pieces are ignored)", [UNKNOWN]),
        make("padding_tail", "one text followed by a padding-only tail",
             [ENGLISH], pad_to=min(longest, 3 * english_ids)),
        make("batch", "sentences of different lengths in one padded batch", BATCH),
    ]
    long = cases[3]
    if int(long.attention_mask.sum()) != longest:
        raise RetrievalError(f"{tokenizer_path}: the long case has {int(long.attention_mask.sum())} pieces, "
                             f"expected the maximum {longest}")
    return cases

