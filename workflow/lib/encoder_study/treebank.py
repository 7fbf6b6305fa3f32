"""TRANSITIONAL: `encoder-study treebank`, until it moves to commands/tagging.py."""

from __future__ import annotations

import sys

from . import files, provenance
from .data.conllu import (
    EWT_URL,
    SPLITS,
    fetch,
    local_path,
    most_frequent_tag_accuracy,
    read_conllu,
    splits_table,
    upos_table,
)
from .data.synthetic import SIZES, TEMPLATES, write_synthetic

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
