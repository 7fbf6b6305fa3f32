"""spaCy as an external baseline: a spaCy pipeline tags the treebank's own words (gold tokens).

Each sentence becomes a spaCy `Doc` of the treebank's syntactic words (`Doc(words=..., spaces=...)`:
the words of a multiword token, never its surface form, so that there is one tag per scored word) and
goes through every component of the pipeline; a word's UPOS is `token.pos_`. A spaCy POS outside the
17 UD tags (SPACE, or none) becomes X, and is counted.

Two sources, both ending as a pipeline directory that `spacy.load` reads:

- `package`: a published pipeline, the wheel of explosion/spacy-models' GitHub release, downloaded by
  `spacy_fetch.fetch_package` (checked against its pinned SHA-256, or the hash recorded), and its data
  directory (`<package>/<package>-<version>/`) unpacked.
- `train`: a tok2vec + morphologizer pipeline trained by `spacy.training.loop.train` from a committed
  spaCy config (config/spacy/tagger.cfg) on the train split, selected on dev (spaCy's model-best). The
  morphologizer, trained on UPOS alone, predicts labels `POS=<tag>` and sets `token.pos_` itself; the
  tagger component would set only `token.tag_`. Training examples keep the gold words
  (`gold_preproc = true` in the config), as tagging does.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import provenance
from ...core import files
from ...core.errors import UserError
from ...data.conllu import UPOS, Sentence
from .settings import Bootstrap

NOT_UD = "X"  # the UPOS of a word whose spaCy POS is not a UD tag
# What the saved config.cfg must not carry: paths of files that exist only while training runs.
TRANSIENT = (("paths", "train"), ("paths", "dev"), ("training", "logger", "output_file"))


class SpacyError(UserError, ValueError):
    """A spaCy source, package or config that cannot be used; the message says what to do."""


# ---------------------------------------------------------------------------------------------------------
# Gold words as spaCy documents


def words_and_spaces(sentence: Sentence) -> tuple[list[str], list[bool]]:
    """The sentence's syntactic words and whether whitespace follows each in its text.

    A word is followed by whitespace when the next word starts after it ends (words are placed in the
    text skipping whitespace); the words of a multiword token touch or share their token's range, so
    none follows them inside it.
    """
    words = sentence.words
    spaces = [nxt.start > word.end for word, nxt in zip(words, words[1:], strict=False)] + [False]
    return [w.form for w in words], spaces


def make_doc(vocab, sentence: Sentence, gold: bool = False):
    """A spaCy Doc of the sentence's words; `gold` sets each word's UPOS (a training example)."""
    from spacy.tokens import Doc

    words, spaces = words_and_spaces(sentence)
    return Doc(vocab, words=words, spaces=spaces, pos=list(sentence.upos) if gold else None)


@dataclass
class Tagged:
    upos: list[tuple[str, ...]]  # per sentence, one tag per word
    not_ud: Counter              # spaCy POS outside UD's 17 tags -> words that got NOT_UD for it


def tag(nlp, sentences: Sequence[Sentence], batch_size: int) -> Tagged:
    """UPOS of every word: each sentence's Doc through all of the pipeline's components."""
    docs = (make_doc(nlp.vocab, s) for s in sentences)
    upos, not_ud = [], Counter()
    for sentence, doc in zip(sentences, nlp.pipe(docs, batch_size=batch_size), strict=True):
        if len(doc) != len(sentence.words):  # a component that retokenizes would misalign the tags
            raise SpacyError(f"sentence {sentence.sent_id!r}: the pipeline returned {len(doc)} tokens for "
                             f"{len(sentence.words)} words; remove the component that merges or splits "
                             "tokens")
        tags = []
        for token in doc:
            pos = token.pos_
            if pos not in UPOS:
                not_ud[pos or "(none)"] += 1
                pos = NOT_UD
            tags.append(pos)
        upos.append(tuple(tags))
    return Tagged(upos, not_ud)


def load(path: str | os.PathLike):
    import spacy

    return spacy.load(Path(path))


# ---------------------------------------------------------------------------------------------------------
# Source `package`: a published pipeline's wheel


def unpack_package(wheel: str | os.PathLike, package: str, version: str, target: str | os.PathLike) -> Path:
    """The pipeline directory of a spaCy model wheel (`<package>/<package>-<version>/`) copied to
    `target` (replacing it), its meta.json checked to name `package` and `version`."""
    prefix = f"{package}/{package}-{version}/"
    target = Path(target)
    with zipfile.ZipFile(wheel) as archive:
        members = sorted(n for n in archive.namelist() if n.startswith(prefix) and not n.endswith("/"))
        if prefix + "meta.json" not in members:
            raise SpacyError(f"{wheel}: no pipeline {prefix} (meta.json) inside; check the package name and "
                             "version given for this wheel")
        with files.staging_dir(target) as staged:
            for member in members:
                relative = Path(member[len(prefix):])
                if relative.is_absolute() or ".." in relative.parts:
                    raise SpacyError(f"{wheel}: refused member {member!r} (a path outside the pipeline)")
                (staged / relative).parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(staged / relative, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            meta = json.loads((staged / "meta.json").read_text(encoding="utf-8"))
            found = (f"{meta.get('lang')}_{meta.get('name')}", meta.get("version"))
            if found != (package, version):
                raise SpacyError(f"{wheel}: its pipeline is {found[0]} {found[1]}, not {package} {version}; "
                                 "give the package and version the wheel holds")
            files.replace_dir(staged, target)
    return target


# ---------------------------------------------------------------------------------------------------------
# Source `train`: a pipeline trained from a spaCy config


@dataclass
class Trained:
    path: Path            # the saved pipeline (spaCy's model-best)
    history: list[dict]   # step, epoch, train_loss, dev_upos at every development evaluation
    best_step: int
    best_dev_upos: float


def write_docbin(vocab, sentences: Sequence[Sentence], path: Path) -> None:
    from spacy.tokens import DocBin

    docs = DocBin(attrs=["POS"], docs=(make_doc(vocab, s, gold=True) for s in sentences))
    docs.to_disk(path)


def train(config_path: str | os.PathLike, train_sentences: Sequence[Sentence],
          dev_sentences: Sequence[Sentence], seed: int, target: str | os.PathLike, log,
          settings: dict | None = None) -> Trained:
    """Train the pipeline of `config_path` on train, select on dev, save it to `target` (replaced).

    The config's seed ([system] seed) is set to `seed`; `settings` overrides more of it (dotted keys,
    e.g. {"training.max_steps": 4}). spaCy's console log goes to the text stream `log`. The saved
    config.cfg is spaCy's with the transient paths (TRANSIENT) set to null, so two runs write the same
    bytes.
    """
    from spacy.training.initialize import init_nlp
    from spacy.training.loop import DIR_MODEL_BEST
    from spacy.training.loop import train as train_loop
    from spacy.util import load_config

    target = Path(target)
    with files.staging_dir(target) as staged:
        corpora = {}
        blank = _blank(config_path)
        for split, sentences in (("train", train_sentences), ("dev", dev_sentences)):
            corpora[split] = staged / f"{split}.spacy"
            write_docbin(blank.vocab, sentences, corpora[split])
        overrides = {**(settings or {}), "system.seed": seed, "paths.train": str(corpora["train"]),
                     "paths.dev": str(corpora["dev"]),
                     "training.logger.output_file": str(staged / "log.jsonl")}
        config = load_config(config_path, overrides=overrides, interpolate=False)
        nlp = init_nlp(config, use_gpu=-1)
        (staged / "out").mkdir()
        train_loop(nlp, staged / "out", use_gpu=-1, stdout=log, stderr=log)
        history = read_log(staged / "log.jsonl")
        best = staged / "out" / DIR_MODEL_BEST
        saved = load_config(best / "config.cfg", interpolate=False)
        for keys in TRANSIENT:
            section = saved
            for key in keys[:-1]:
                section = section[key]
            section[keys[-1]] = None
        saved.to_disk(best / "config.cfg")
        files.replace_dir(best, target)
    # spaCy's choice: it saves model-best at every score equal to the best so far (score == max(results)[0]),
    # so of equal best scores the last one is on disk.
    chosen = max(history, key=lambda h: (h["dev_upos"], h["step"]))
    return Trained(target, history, chosen["step"], chosen["dev_upos"])


def _blank(config_path: str | os.PathLike):
    """An empty pipeline of the config's language: the vocabulary the training documents are made in."""
    import spacy
    from spacy.util import load_config

    return spacy.blank(load_config(config_path, interpolate=False)["nlp"]["lang"])


def read_log(path: Path) -> list[dict]:
    """The development evaluations of spaCy's JSONL training log (ConsoleLogger's output_file): step,
    epoch, the summed training loss since the last evaluation, and dev UPOS in percent."""
    history = []
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        history.append({"step": entry["step"], "epoch": entry["epoch"],
                        "train_loss": float(sum(entry["losses"].values())),
                        "dev_upos": float(entry["scores"]["pos_acc"])})
    if not history:
        raise SpacyError(f"{path}: spaCy logged no development evaluation; give the config a training "
                         "section whose eval_frequency is reached")
    return history


# ---------------------------------------------------------------------------------------------------------
# A run: the pipeline (trained or unpacked), every scored split tagged and scored as every run is

PIPELINE_DIR = "spacy"  # results/tagging/<run>/spacy: the pipeline that tagged, as spacy.load reads it
MODE = "spacy"


@dataclass(frozen=True)
class Source:
    """Where the run's pipeline comes from: `train` (config) or `package` (wheel, package, version)."""

    kind: str
    config: str | None = None
    settings: dict | None = None  # train: more of the config, e.g. {"training.max_steps": 4}
    wheel: str | None = None
    package: str | None = None
    version: str | None = None

    @property
    def encoder(self) -> str:
        """The scores table's encoder column: the package and version, or the training config."""
        return f"{self.package}-{self.version}" if self.kind == "package" else str(self.config)


@dataclass
class SpacyRun:
    rows: list[dict]
    outputs: list[Path]
    record: dict
    trained: Trained | None


def run(name: str, source: Source, paths: dict[str, str | os.PathLike], out_dir: str | os.PathLike,
        seed: int, batch_size: int, bootstrap: Bootstrap, log) -> SpacyRun:
    """Make the run's pipeline, tag dev, test and every extra test set of `paths` with it, score them.

    `train` trains on paths["train"] and selects on paths["dev"] (`train`); `package` unpacks the wheel.
    The words are tagged by the pipeline as saved under <out_dir>/spacy, reloaded, so that the written
    pipeline is the one scored. Writes what every run writes (`splits`): predictions, scores, run.json.
    """
    from . import evaluate, splits

    out_dir = Path(out_dir)
    scored = splits.scored_splits(paths)
    read = ("train", *scored) if source.kind == "train" else scored
    sentences = splits.read_splits({split: paths[split] for split in read})
    pipeline_dir = out_dir / PIPELINE_DIR
    trained = None
    if source.kind == "train":
        trained = train(source.config, sentences["train"], sentences["dev"], seed, pipeline_dir, log,
                        source.settings)
    elif source.kind == "package":
        unpack_package(source.wheel, source.package, source.version, pipeline_dir)
    else:
        raise SpacyError(f"run {name!r}: source must be 'train' or 'package', not {source.kind!r}")
    nlp = load(pipeline_dir)
    rows, scores, not_ud = [], {}, {}
    for split in scored:
        tagged = tag(nlp, sentences[split], batch_size)
        not_ud[split] = dict(sorted(tagged.not_ud.items()))
        scores[split] = splits.score_split(sentences[split], tagged.upos, splits.pred_path(out_dir, split),
                                           bootstrap)
        rows.append(evaluate.score_row(name, source.encoder, MODE, "none", split, scores[split]))
    record = _record(name, source, nlp, paths, read, not_ud, trained)
    if trained is not None:
        # The saved pipeline, reloaded, must score on dev what selected it during training.
        record["dev_upos_check"] = abs(scores["dev"].upos - trained.best_dev_upos) < 1e-6
    evaluate.write_scores(out_dir / splits.SCORES, rows)
    files.write_json(out_dir / splits.RUN_JSON, record)
    outputs = [splits.pred_path(out_dir, split) for split in scored] + files.list_files(pipeline_dir)
    outputs += [out_dir / n for n in (splits.SCORES, "scores.md", splits.RUN_JSON)]
    return SpacyRun(rows=rows, outputs=outputs, record=record, trained=trained)


def _record(name: str, source: Source, nlp, paths: dict, read: Sequence[str], not_ud: dict,
            trained: Trained | None) -> dict:
    """run.json of a spaCy run: what every run records, the source, spaCy's version and the pipeline."""
    from importlib import metadata

    from .splits import split_record

    record = {
        "run": name, "encoder": source.encoder, "mode": MODE, "pooling": "none",
        "source": {k: v for k, v in vars(source).items() if v and k != "wheel"},
        "spacy_version": metadata.version("spacy"), "pipeline": PIPELINE_DIR,
        "components": list(nlp.pipe_names), "not_ud": not_ud,
        "splits": {split: split_record(paths[split]) for split in read},
    }
    if source.kind == "package":
        record["source"]["wheel_sha256"] = files.sha256_file(source.wheel)
    if trained is not None:
        record["selected"] = {"step": trained.best_step, "dev_upos": trained.best_dev_upos}
        record["history"] = trained.history
    return record


def recorded(name: str, source: Source, done: SpacyRun, inputs: list, seed: int) -> provenance.Done:
    """What a spaCy run did, for its fragment: its files and scores, its training history or its package,
    how the words were tagged; the lines its log prints."""
    from ...core.tables import markdown_table
    from . import evaluate
    from .splits import scores_said

    provenance.used("spaCy pipeline", f"{source.encoder}: {', '.join(done.record['components'])}")
    out = provenance.Done(inputs=list(inputs), outputs=list(done.outputs))
    out.table("Scores", evaluate.scores_markdown(done.rows))
    trained = done.trained
    if trained is not None:
        out.table("Development history", markdown_table(
            ["step", "epoch", "train loss", "dev UPOS"],
            [(h["step"], h["epoch"], f"{h['train_loss']:.4f}", f"{h['dev_upos']:.2f}")
             for h in trained.history], "rrrr"))
        out.note(f"trained from {source.config} (seed {seed}) on the train split; selected step "
                 f"{trained.best_step} (development UPOS {trained.best_dev_upos:.2f}), spaCy's model-best; "
                 "every split tagged by the saved pipeline, reloaded")
        if not done.record["dev_upos_check"]:
            out.note("WARNING: the saved pipeline's development score differs from the one that selected it")
    else:
        out.note(f"published pipeline {done.record['encoder']}, unpacked from {source.wheel} (SHA-256 "
                 f"{done.record['source']['wheel_sha256']})")
    out.note("each sentence's gold words (a multiword token's words, not its surface form) as one spaCy "
             "Doc through every component; UPOS from token.pos_")
    for split, counts in done.record["not_ud"].items():
        if counts:
            out.note(f"{split}: spaCy POS outside UD's tags, scored as {NOT_UD}: {counts}")
    out.said += scores_said(name, done.rows)
    return out
