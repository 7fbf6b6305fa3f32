"""The tagging recipe's treebank stages: the synthetic treebank, its out-of-domain set and a downloaded
treebank split (UD English-EWT), each returning what it did (`provenance.Done`) for its command to
record: the files, the splits' and tags' tables, and notes."""

from __future__ import annotations

import os

from ... import provenance
from ...core.tables import markdown_table
from ...data import SPLITS, conllu


def download_note(url: str, sha256: str, pinned: bool) -> str:
    """The fragment's line on a download: its SHA-256, checked against the pin or recorded to be pinned."""
    if pinned:
        return f"{url}: SHA-256 {sha256} (pinned and checked)"
    return (f"{url}: SHA-256 {sha256}: recorded on first download, not pinned; put it in the config to "
            "make the next run check it")


def _described(done: provenance.Done, by_split: dict) -> None:
    done.table("Splits" if len(by_split) > 1 else "Split", conllu.splits_table(by_split))
    done.table("UPOS", conllu.upos_table(by_split))


def synthetic(out_dir: str | os.PathLike, seed: int, sizes: dict[str, int]) -> provenance.Done:
    """Write the synthetic treebank's splits (data.synthetic) and describe them."""
    from ...data.synthetic import TEMPLATES, write_synthetic

    paths = write_synthetic(out_dir, seed, sizes)
    done = provenance.Done(outputs=[paths[s] for s in SPLITS])
    by_split = {split: conllu.read_conllu(paths[split]) for split in SPLITS}  # the reader EWT goes through
    _described(done, by_split)
    train = by_split["train"]
    baseline = [(split, f"{100 * conllu.most_frequent_tag_accuracy(train, by_split[split]):.2f}")
                for split in ("dev", "test")]
    done.table("Most-frequent-tag baseline (trained on train)",
               markdown_table(["split", "UPOS accuracy %"], baseline, "lr"))
    done.note(f"synthetic treebank: {len(TEMPLATES)} templates; split k of {list(SPLITS)} is drawn from "
              f"numpy SeedSequence([{seed}, k]), so a split does not depend on the others' sizes")
    done.note("the HEAD and DEPREL columns hold a flat tree (every word attached to the root): valid "
              "for the UD evaluation script, not a real analysis; only UPOS is meant to be learned")
    words = sum(len(s.words) for v in by_split.values() for s in v)
    done.said.append(f"encoder-study tagging treebank: {words} words in "
                     f"{out_dir}/{{{','.join(SPLITS)}}}.conllu")
    return done


def ood(out: str | os.PathLike, seed: int, sentences: int, name: str) -> provenance.Done:
    """Write the synthetic out-of-domain test set and describe it."""
    from ...data.synthetic import OOD_STREAM, OOD_TEMPLATES, write_ood

    path = write_ood(out, seed, sentences, name)
    done = provenance.Done(outputs=[path])
    _described(done, {name: conllu.read_conllu(path)})
    done.note(f"synthetic out-of-domain test set: {len(OOD_TEMPLATES)} templates and word lists of its "
              f"own (encoder_study.data.synthetic.OOD_*), drawn from numpy SeedSequence([{seed}, "
              f"{OOD_STREAM}]); scored only, never trained on or used for selection")
    done.said.append(f"encoder-study tagging ood: {sentences} sentences -> {out}")
    return done


def fetch(split: str, url: str, out: str | os.PathLike, sha256: str, timeout: float) -> provenance.Done:
    """Download one treebank split (data.fetch: checked against its pin) and describe it."""
    from ...data import fetch as fetching

    path = conllu.local_path(url)
    fetched = fetching.treebank(url, out, sha256, timeout=timeout)
    done = provenance.Done(inputs=[path] if path is not None else [], outputs=[out])
    _described(done, {split: fetched.sentences})
    done.note(download_note(url, fetched.sha256, fetched.pinned))
    done.said.append(f"encoder-study tagging fetch: {url} -> {out} ({len(fetched.sentences)} sentences, "
                     f"SHA-256 {fetched.sha256})")
    return done
