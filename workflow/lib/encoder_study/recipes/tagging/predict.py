"""Tag new data with a saved pipeline: a CoNLL-U file in, the same file with the UPOS column predicted out.

    done = predict("results/tagging/run/pipeline.safetensors", "new.conllu", "new.pred.conllu",
                   input_format="conllu", batch_sentences=1000, threads=None,
                   score=Bootstrap(resamples=1000, seed=0, confidence=0.95, method="percentile"))

Any pipeline `pipeline.load` reads works: inline weights (a tagging run's) or a written graph beside
the file (the writeback recipe's). CoNLL-U output differs from the input only in the UPOS column of
its word rows (`Sentence.render`, as a run's own `.pred.conllu`). Plain text (`input_format="text"`) is
one pre-tokenized sentence a line, tokens separated by whitespace; blank lines are skipped; each
sentence comes out as CoNLL-U with `# sent_id` (its line number), `# text` (the tokens joined by single
spaces), ids, forms and the predicted UPOS, every other column `_`.

Streaming: the input is read `batch_sentences` sentences at a time, tagged, and appended to a
temporary file beside the output, renamed onto it only when every sentence is tagged, so a failure
leaves no half-written output. A killed command leaves no temporary file either: SIGTERM unwinds it
(`cli`) and the file is removed on the way out; after a SIGKILL, the next `predict` to the same output
removes the dead run's file before it starts (`files.sweep`). One progress line per batch goes to
stderr.

Why the predictions equal a run's: a run predicts a split with `Tagger.predict(docs, eval_batch_words)`,
which runs the documents in consecutive groups that close as soon as they hold `eval_batch_words`
words (`tagger.word_batches`). The words of a frozen encoder's windows depend, to the last bit, on
which windows share a padded ONNX Runtime batch, and a trainable encoder's on which documents share a
forward; so the groups, not the reading batches, must be the run's. Here the same greedy rule runs over
the whole stream, with the `eval_batch_words` and the thread count the pipeline's training record
holds: a group left open at the end of a reading batch is carried into the next, so the groups (and so
the bytes written) are the same for every `batch_sentences`. The frozen encoder's cache is cleared
after each group, which bounds memory on large inputs; an input sentence equal to an earlier one is
therefore encoded again in its own group rather than read from the cache as the run may have (its
vectors can differ in the last bits, which a tag almost never notices). Runs that predicted in bf16
or on a GPU are reproduced here in float32 on the CPU, so their tags may differ where two tags are
nearly tied.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...core import files, machine
from ...core.errors import UserError
from ...data import conllu
from ...data.conllu import Sentence, TreebankError, Word
from ...encoders.frozen import FrozenEncoder
from . import evaluate, pipeline
from .settings import Bootstrap
from .tagger import EVAL_BATCH_WORDS, Tagger, word_batches

FORMATS = ("conllu", "text")
PLACEHOLDER = "_"  # the UPOS of a plain-text word before it is predicted (no gold tag)


class PredictError(UserError):
    """The input, the output or the pipeline cannot be used; the message names the file and the fix."""


@dataclass
class Predicted:
    """What `predict` wrote: counts, the tagging time, the settings used and the score if asked."""

    out: Path
    sentences: int
    words: int
    seconds: float
    batch_words: int
    threads: int
    accuracy: evaluate.Accuracy | None


def recorded_settings(path: str | os.PathLike) -> dict:
    """The training settings a pipeline file records (empty when it records none)."""
    training = pipeline.training_summary(path) or {}
    settings = training.get("settings")
    return settings if isinstance(settings, dict) else {}


# ---------------------------------------------------------------------------------------------------------
# Reading in batches


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line with its ending) of a UTF-8 file; only '\\n' ends a line, as the reader's."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise TreebankError(f"{path}:{number}: not UTF-8 ({err.reason} at byte {err.start} of the "
                                    "line); the input is read as UTF-8: convert the file") from err


def _blank(line: str, first: bool) -> bool:
    """Whether the reader takes the line as blank (a byte-order mark on the file's first line aside)."""
    return not (line.lstrip("\ufeff") if first else line).strip()


def conllu_batches(path: str | os.PathLike, batch_sentences: int) -> Iterator[list[Sentence]]:
    """The sentences of a CoNLL-U file, `batch_sentences` at a time, read as `conllu.read_conllu` reads
    the whole file (same errors, same line numbers, same raw lines: the batches' lines joined give the
    file back)."""
    path = Path(path)
    seen: dict[str, int] = {}
    pending: list[str] = []  # lines of the batch being gathered
    first = 1  # line number of pending[0]
    blocks = 0  # sentences begun in pending
    previous_blank = True
    any_sentence = False

    def parse(lines: list[str], at: int) -> list[Sentence]:
        sentences = conllu.parse_conllu("".join(lines), str(path), first_line=at)
        for s in sentences:  # ids must be unique over the whole file, not only within a batch
            line = s.first_line + next(i for i, raw in enumerate(s.lines) if not _blank(raw, i == 0))
            if s.sent_id in seen:
                raise TreebankError(f"{path}:{line}: sentence id {s.sent_id!r} was already used by the "
                                    f"sentence at line {seen[s.sent_id]}; give every sentence its own id")
            seen[s.sent_id] = line
        return sentences

    for number, line in _lines(path):
        blank = _blank(line, number == 1)
        if not blank and previous_blank:  # a sentence starts here
            if blocks == batch_sentences:
                yield parse(pending, first)
                pending, first, blocks = [], number, 0
            blocks += 1
            any_sentence = True
        pending.append(line)
        previous_blank = blank
    if any_sentence:
        yield parse(pending, first)
    else:
        conllu.parse_conllu("".join(pending), str(path))  # the reader's "no sentences" error


def text_batches(path: str | os.PathLike, batch_sentences: int) -> Iterator[list[Sentence]]:
    """Pre-tokenized plain text, one sentence a line, as sentences whose rendering is CoNLL-U."""
    batch: list[Sentence] = []
    any_sentence = False
    for number, line in _lines(Path(path)):
        tokens = line.split()
        if not tokens:
            continue
        batch.append(text_sentence(str(number), tokens))
        any_sentence = True
        if len(batch) == batch_sentences:
            yield batch
            batch = []
    if batch:
        yield batch
    if not any_sentence:
        raise PredictError(f"{path}: no sentences (the file is empty or blank); plain-text input is one "
                           "pre-tokenized sentence a line, tokens separated by spaces")


def text_sentence(sent_id: str, tokens: Sequence[str]) -> Sentence:
    """A sentence of the given tokens: `# sent_id`, `# text`, one row per token with only ID and FORM."""
    text = " ".join(tokens)
    lines = [f"# sent_id = {sent_id}\n", f"# text = {text}\n"]
    words, start = [], 0
    for i, token in enumerate(tokens, 1):
        words.append(Word(i, token, PLACEHOLDER, start, start + len(token), line=len(lines) + 1))
        lines.append("\t".join([str(i), token, "_", PLACEHOLDER, *["_"] * 6]) + "\n")
        start += len(token) + 1
    lines.append("\n")
    return Sentence(sent_id=sent_id, text=text, words=tuple(words), lines=tuple(lines), first_line=1)


# ---------------------------------------------------------------------------------------------------------
# Tagging


def _tag_groups(tagger: Tagger, sentences: Sequence[Sentence], groups: Sequence[Sequence[int]]
                ) -> list[list[str]]:
    """Tags of `sentences`, group by group: each group is one forward, as in `Tagger.predict`."""
    out: list[list[str]] = []
    for group in groups:
        out += tagger.predict([sentences[i].doc() for i in group], batch_words=sys.maxsize)
        if isinstance(tagger.encoder, FrozenEncoder):
            tagger.encoder.clear_cache()  # bounded memory on large inputs (see the module docstring)
    return out


def predict(pipeline_path: str | os.PathLike, input_path: str | os.PathLike, out: str | os.PathLike,
            input_format: str, batch_sentences: int, threads: int | None, score: Bootstrap | None,
            batch_words: int | None = None, progress: bool = True) -> Predicted:
    """Tag `input_path` with the pipeline and write `out` (see the module docstring).

    `threads` None and `batch_words` None take the pipeline's recorded training settings (the run's
    thread count and `eval_batch_words`), else 1 and `tagger.EVAL_BATCH_WORDS`. With `score`, the input's
    own UPOS are the gold tags (CoNLL-U only), scored with that bootstrap; None: not scored.
    """
    from ...encoders.trainable.common import determinism

    pipeline_path, input_path, out = Path(pipeline_path), Path(input_path), Path(out)
    _check_request(pipeline_path, input_path, out, input_format, batch_sentences, score is not None)
    files.sweep(out)  # a killed run's temporary file, before the pipeline takes its time to load
    recorded = recorded_settings(pipeline_path)
    threads = machine.usable_threads(threads if threads is not None else int(recorded.get("threads", 1)))
    if batch_words is None:
        batch_words = int(recorded.get("eval_batch_words", EVAL_BATCH_WORDS))
    tagger = pipeline.load(pipeline_path, threads=threads)
    batches = (conllu_batches if input_format == "conllu" else text_batches)(input_path, batch_sentences)
    with determinism(threads), files.atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8",
                                                                   newline="") as handle:
        done = _tag_stream(tagger, batches, batch_words, handle, score is not None, progress)
    accuracy = evaluate.accuracy_interval(done.gold, done.predicted, score) if score is not None else None
    return Predicted(out=out, sentences=done.sentences, words=done.words, seconds=done.seconds,
                     batch_words=batch_words, threads=threads, accuracy=accuracy)


def _check_request(pipeline_path: Path, input_path: Path, out: Path, input_format: str, batch_sentences: int,
                   score: bool) -> None:
    """Refuse, before anything is loaded, what `predict` cannot do as asked."""
    if input_format not in FORMATS:
        raise ValueError(f"input_format must be one of {FORMATS}, got {input_format!r}")
    if batch_sentences < 1:
        raise PredictError(f"--batch-sentences {batch_sentences}: give a positive number of sentences")
    if not pipeline_path.is_file():
        raise PredictError(f"{pipeline_path}: no such pipeline file; give --pipeline the "
                           f"{pipeline.FILE_NAME} of a tagging run (results/tagging/<run>/) or of the "
                           "writeback recipe (results/writeback/<run>/, with its graph beside it)")
    if not input_path.is_file():
        raise PredictError(f"{input_path}: no such input file; give --input a CoNLL-U file, or plain text "
                           "with --format text")
    if out.resolve() == input_path.resolve():
        raise PredictError(f"{out}: the output would replace the input; give --out another path")
    if score and input_format != "conllu":
        raise PredictError("scoring needs gold tags: only a CoNLL-U input has them (drop the score "
                           "option for plain text)")


@dataclass
class _Streamed:
    """What `_tag_stream` tagged: counts, the tagging time, and (when scoring) gold and predicted tags."""

    sentences: int = 0
    words: int = 0
    seconds: float = 0.0
    gold: list[tuple[str, ...]] = field(default_factory=list)
    predicted: list[list[str]] = field(default_factory=list)


def _tag_stream(tagger: Tagger, batches, batch_words: int, handle, score: bool, progress: bool) -> _Streamed:
    """Tag the batches of sentences in groups of `batch_words` words and write them to `handle`."""
    done = _Streamed()
    carried: list[Sentence] = []  # sentences of a group still open at the end of the last batch
    ended = False
    while not ended:
        batch = next(batches, None)
        ended = batch is None
        pending = carried + (batch or [])
        if not pending:
            continue
        groups = word_batches([len(s.words) for s in pending], range(len(pending)), batch_words)
        # A group closes once it holds batch_words words; the last one may be open: carry it over.
        last_closed = sum(len(pending[i].words) for i in groups[-1]) >= batch_words
        ready = groups if ended or last_closed else groups[:-1]
        count = sum(len(g) for g in ready)
        started = time.perf_counter()
        tags = _tag_groups(tagger, pending, ready)
        done.seconds += time.perf_counter() - started
        tagged, carried = pending[:count], pending[count:]
        handle.write(conllu.render(tagged, tags, tagger.task))
        if score:
            done.gold += [s.tags(tagger.task) for s in tagged]
            done.predicted += tags
        done.sentences += len(tagged)
        done.words += sum(len(s.words) for s in tagged)
        if progress and tagged:
            rate = done.words / done.seconds if done.seconds > 0 else float("inf")
            print(f"predict: {done.sentences} sentences, {done.words} words, {rate:.0f} words/s",
                  file=sys.stderr, flush=True)
    return done
