"""Random encoders of any size and the hand-made tokenizers they read, built from an architecture file.

The source kind is called `tiny` for its first use (the embedded default's 2-layer models); the same
code builds a random model of a real model's full shape (config/models/mmbert-base.json: 22 x 768 over
256,000 tokens), which config/rehearsal.yaml uses to rehearse the full study on one CPU machine. The
name stays because it is recorded in every export manifest.

The models are ours, not derived from any released model: a seed fixes every weight. After the
library's own initialisation every parameter is perturbed, so that biases and norm weights are not
the zeros and ones a fresh model has and a parity test notices a weight read from the wrong place.

The tokenizers know a few hundred pieces (characters of many scripts and common English words). An
architecture file's `tokenizer.vocab_size` pads that vocabulary to a real model's size with generated
letter strings (2, 3, 4... letters, each as a word start and as a continuation) in a fixed order, so a
256,000-piece tokenizer is built in about a second and is the same on every machine.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..core import files
from ..core.errors import UserError
from . import families

# Characters the tiny tokenizers know, by script; everything else becomes the unknown token.
_RANGES = [
    (0x21, 0x7E),      # ASCII printable
    (0xC0, 0xFF),      # Latin-1 letters
    (0x100, 0x17F),    # Latin Extended-A
    (0x391, 0x3C9),    # Greek
    (0x400, 0x44F),    # Cyrillic
    (0x5D0, 0x5EA),    # Hebrew
    (0x621, 0x64A),    # Arabic
    (0x905, 0x94D),    # Devanagari
    (0xE01, 0xE3A),    # Thai
    (0x3041, 0x3093),  # Hiragana
    (0x30A1, 0x30F3),  # Katakana
]
_EXTRA_CHARS = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年日本語文字"
    "한국어가나다라마바사아자차카타파하"
)
_WORDS = (
    "the of and to a in is that for it as was with be by on not he I this are or his from at which "
    "but have an they you were her she there been one all we their has would when if more will no "
    "can out up do said about what so its into them than time only could new some these two may "
    "first then do any like my now over such our man me even most made after also did many before "
    "must through back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off come since "
    "against go came right used take three book run runs running walk walks light fast can saw duck "
    "fish bank play plays record records house houses water work works time flies like"
).split()
_SUFFIXES = ["s", "es", "ed", "ing", "er", "est", "ly", "ion", "al", "en"]
# The letters of the generated pieces that pad a vocabulary to its size, most frequent (English) first.
_FILL_LETTERS = "etaoinsrhldcumfpgwybvkxjqz"


def _alphabet() -> list[str]:
    chars = {chr(c) for lo, hi in _RANGES for c in range(lo, hi + 1) if chr(c).isprintable()}
    chars.update(_EXTRA_CHARS)
    return sorted(chars)


def _unique(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


def _filler(count: int, taken: set[str], start: str, continuation: str) -> list[str]:
    """`count` generated pieces not in `taken`: strings of 2, 3, 4... letters, in a fixed order, each
    as a word start (`start` + letters) and as a continuation (`continuation` + letters)."""
    found: list[str] = []
    for n in itertools.count(2):
        for letters in itertools.product(_FILL_LETTERS, repeat=n):
            for piece in (start + "".join(letters), continuation + "".join(letters)):
                if len(found) == count:
                    return found
                if piece not in taken:
                    taken.add(piece)
                    found.append(piece)
    raise AssertionError("unreachable: the letter strings never run out")


def _padding(pieces: list[str], vocab_size: int | None, start: str, continuation: str) -> list[str]:
    """The generated pieces that bring `pieces` to `vocab_size` (none without a size)."""
    if vocab_size is None:
        return []
    if vocab_size < len(pieces):
        raise ArchitectureError(f"tokenizer.vocab_size {vocab_size} is below the {len(pieces)} pieces "
                                "the hand-made vocabulary has; give at least that many")
    return _filler(vocab_size - len(pieces), set(pieces), start, continuation)


def wordpiece_tokenizer(specials: dict[str, str], vocab_size: int | None = None) -> Tokenizer:
    """A cased BERT-style WordPiece tokenizer: characters, `##` continuations, common words, and
    generated pieces up to `vocab_size`."""
    alphabet = _alphabet()
    pieces = _unique(list(specials.values()) + alphabet + ["##" + c for c in alphabet]
                     + _WORDS + ["##" + s for s in _SUFFIXES])
    pieces += _padding(pieces, vocab_size, "", "##")
    tok = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token=specials["unk"],
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=False, lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = specials["cls"], specials["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, pieces.index(cls)), (sep, pieces.index(sep))])
    tok.decoder = decoders.WordPiece()
    return tok


def unigram_tokenizer(specials: dict[str, str], vocab_size: int | None = None) -> Tokenizer:
    """An XLM-R-style SentencePiece unigram tokenizer: `▁`-prefixed words, then characters, and
    generated pieces (scored between the two) up to `vocab_size`."""
    alphabet = _alphabet()
    scored = ([(s, 0.0) for s in specials.values()] + [("▁" + w, -4.0) for w in _WORDS]
              + [("▁", -6.0)] + [(s, -7.0) for s in _SUFFIXES] + [("▁" + c, -9.0) for c in alphabet]
              + [(c, -10.0) for c in alphabet])
    vocab = list({p: s for p, s in reversed(scored)}.items())[::-1]  # first score wins, order kept
    vocab += [(p, -8.0) for p in _padding([p for p, _ in vocab], vocab_size, "▁", "")]
    names = [p for p, _ in vocab]
    tok = Tokenizer(models.Unigram(vocab, unk_id=names.index(specials["unk"]), byte_fallback=False))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    cls, sep = specials["cls"], specials["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
        special_tokens=[(cls, names.index(cls)), (sep, names.index(sep))])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


TOKENIZERS = {"wordpiece": wordpiece_tokenizer, "unigram": unigram_tokenizer}


class ArchitectureError(UserError, ValueError):
    pass


def read_architecture(path: str | os.PathLike) -> dict:
    path = Path(path)
    arch = files.read_json(path, "an architecture file (tokenizer and config)",
                           "see config/models/bert-tiny.json for the format", kind=dict,
                           error=ArchitectureError)
    for key in ("tokenizer", "config"):
        if key not in arch:
            raise ArchitectureError(f"{path}: missing key '{key}' (see config/models/bert-tiny.json)")
    kind = arch["tokenizer"].get("kind")
    if kind not in TOKENIZERS:
        raise ArchitectureError(f"{path}: tokenizer.kind is {kind!r}; use one of {sorted(TOKENIZERS)}")
    if "model_type" not in arch["config"]:
        raise ArchitectureError(f"{path}: config.model_type is missing (bert, xlm-roberta, modernbert)")
    size = arch["tokenizer"].get("vocab_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ArchitectureError(f"{path}: tokenizer.vocab_size is {size!r}; give a positive integer")
    return arch


def tokenizer(arch: dict) -> Tokenizer:
    """The tokenizer an architecture (read_architecture) describes."""
    spec = arch["tokenizer"]
    return TOKENIZERS[spec["kind"]](spec["specials"], spec.get("vocab_size"))


def build(architecture: str | os.PathLike, seed: int, out_dir: str | os.PathLike) -> dict:
    """Write config.json, model.safetensors and tokenizer.json of a random model into `out_dir`."""
    from transformers import AutoConfig, AutoModel

    arch = read_architecture(architecture)
    specials = arch["tokenizer"]["specials"]
    try:
        tok = tokenizer(arch)
    except ArchitectureError as err:
        raise ArchitectureError(f"{architecture}: {err}") from err
    ids = {role: tok.token_to_id(piece) for role, piece in specials.items()}
    hf = dict(arch["config"])
    model_type = hf.pop("model_type")
    hf.update(vocab_size=tok.get_vocab_size(), pad_token_id=ids["pad"])
    hf.update(families.of_config({"model_type": model_type}).random_ids(ids))
    config = AutoConfig.for_model(model_type, **hf)

    torch.manual_seed(seed)
    model = AutoModel.from_config(config, attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed + 1)
    std = float(arch.get("perturb_std", 0.1))
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.add_(torch.randn(param.shape, generator=generator) * std)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    files.write_text(out_dir / "tokenizer.json", tok.to_str(pretty=True) + "\n")
    return {"vocab_size": tok.get_vocab_size(), "parameters": sum(p.numel() for p in model.parameters())}
