"""TRANSITIONAL: `encoder-study texts`, until it moves to commands/parity.py."""
# ruff: noqa: F403, F405

from __future__ import annotations

import sys

from . import files, provenance
from .data.texts import *  # noqa: F403

# --- commands -------------------------------------------------------------------------------------

def _select_main(args) -> int:
    sources: dict[str, Iterable[Text]] = {}
    stats = {s: SourceStats() for s in SOURCES}
    hashes: dict[str, tuple[str, bool]] = {}
    inputs = []
    for source, reader in (("tatoeba", read_tatoeba), ("udhr", read_udhr)):
        given, count = getattr(args, source), getattr(args, f"{source}_count")
        if count == 0:
            continue
        if not given:
            raise TextError(f"--{source} is required when --{source}-count is {count}")
        path = local_path(given)
        if path is None:
            raise TextError(f"--{source} {given}: a network URL; fetch it first with `encoder-study texts "
                            "fetch` and give the local file")
        hashes[source] = source_sha256(path, getattr(args, f"{source}_sha256"), source)
        inputs.append(path)
        sources[source] = reader(path, stats[source])
    languages = [c.strip() for c in args.languages.split(",") if c.strip()] if args.languages else None
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.inputs += inputs
        selection = select_texts(sources, {"tatoeba": args.tatoeba_count, "udhr": args.udhr_count},
                                 args.seed, args.max_chars, languages, stats)
        write_jsonl(args.out, selection.records)
        frag.outputs.append(args.out)
        records = selection.records
        frag.table("Texts per language and script", counts_table(records))
        frag.table("Texts per script", scripts_table(records))
        frag.note(f"{len(records)} texts in {len({r['lang'] for r in records})} languages and "
                  f"{len({r['script'] for r in records})} scripts, chosen with seed {args.seed}; "
                  f"{sum(r['truncated'] for r in records)} cut at {args.max_chars} code points on a grapheme "
                  "boundary")
        for source, (digest, was_pinned) in hashes.items():
            state = "pinned and checked" if was_pinned else (
                "recorded, not pinned: put it in the config to make the next run check it")
            frag.note(f"{source} source SHA-256 {digest} ({state})")
        for source, pool in selection.pools.items():
            st = stats[source]
            if source not in sources:
                frag.note(f"{source}: not read (count 0)")
                continue
            skipped = sum(pool.ineligible.values())
            top = ", ".join(f"{c} ({n})" for c, n in sorted(pool.ineligible.items(),
                                                             key=lambda kv: (-kv[1], kv[0]))[:12])
            frag.note(f"{source}: {st.records} records in {st.files} file(s); {sum(pool.available.values())} "
                      f"eligible in {len(pool.available)} language/script groups; {skipped} in languages not "
                      f"asked for or not in the registry{': ' + top if top else ''}"
                      + (f"; {st.no_language} without a language (\\N)" if st.no_language else "")
                      + (f"; {st.not_iso} with a non-ISO code ({', '.join(sorted(TATOEBA_NOT_ISO))})"
                         if st.not_iso else "")
                      + (f"; {st.empty} empty paragraphs" if st.empty else ""))
        frag.note("rule: within each language/script group, texts in order of SHA-256(seed, source, id); "
                  "groups visited with scripts alternating; see encoder_study.texts")
    print(f"encoder-study texts: wrote {len(records)} texts to {args.out}")
    return 0


def _fetch_main(args) -> int:
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        path = local_path(args.url)
        if path is not None:
            frag.inputs.append(path)
        digest = fetch(args.url, args.out, args.sha256, timeout=args.timeout)
        frag.outputs.append(args.out)
        if pinned(args.sha256, "--sha256"):
            frag.note(f"{args.url}: SHA-256 {digest} (pinned and checked)")
        else:
            frag.note(f"{args.url}: SHA-256 {digest} (recorded, not pinned: put it in the config to make "
                      "the next run check it)")
    print(f"encoder-study texts fetch: {args.url} -> {args.out} (SHA-256 {digest})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`encoder-study texts [select] ...` picks the parity texts; `encoder-study texts fetch ...` downloads
    a source. Without a sub-command the arguments are those of `select`."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    action = argv.pop(0) if argv and argv[0] in ("select", "fetch") else "select"
    if action == "fetch":
        parser = argparse.ArgumentParser(prog="encoder-study texts fetch",
                                         description="fetch a source (URL, file:// URL or path) to a file")
        provenance.add_arguments(parser)
        parser.add_argument("--url", required=True, help=f"e.g. {TATOEBA_URL} or {UDHR_URL}")
        parser.add_argument("--sha256", default="", help="pinned SHA-256; empty: record it instead")
        parser.add_argument("--out", required=True, help="the local file to write")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data, then give up")
    else:
        parser = argparse.ArgumentParser(prog="encoder-study texts [select]",
                                         description="select the parity texts from Tatoeba and the UDHR")
        provenance.add_arguments(parser)
        parser.add_argument("--tatoeba", help="sentences.tar.bz2 or sentences.csv (a path or file:// URL)")
        parser.add_argument("--tatoeba-sha256", default="", help="pinned SHA-256; empty: record it")
        parser.add_argument("--udhr", help="udhr_xml.zip or a directory of udhr_<key>.xml files")
        parser.add_argument("--udhr-sha256", default="",
                            help="pinned SHA-256 (of a directory: files.tree_sha256); empty: record it")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--tatoeba-count", type=int, default=150)
        parser.add_argument("--udhr-count", type=int, default=50)
        parser.add_argument("--max-chars", type=int, default=400, help="cut texts to this many code points")
        parser.add_argument("--languages", default="",
                            help="comma-separated ISO 639-3 codes to draw from (default: all registered)")
        parser.add_argument("--out", required=True, help="results/texts/parity_texts.jsonl")
    args = parser.parse_args(argv)
    try:
        return _fetch_main(args) if action == "fetch" else _select_main(args)
    except (TextError, files.IntegrityError) as err:
        print(f"encoder-study texts {action}: error: {err}", file=sys.stderr)
        return 2

