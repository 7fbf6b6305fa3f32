"""`encoder-study retrieval heads|export|verify|quantisation`: the three-head retrieval graph (library: the
package retrieval).

    encoder-study retrieval heads --source results/retrieval/source/source.json --seed 0 \\
        --out-dir results/retrieval/heads --provenance P
    encoder-study retrieval export --source S --heads-dir results/retrieval/heads \\
        --out-dir results/retrieval/model --parity results/retrieval/parity.csv \\
        --markdown results/retrieval/parity.md --opset 18 --tolerance 1e-4 --ort-optimization basic \\
        --external-data auto --threads 1 --provenance P
    encoder-study retrieval verify results/retrieval/model --manifest retrieval.json --provenance P
    encoder-study retrieval quantisation --model-dir results/retrieval/model --source S \\
        --heads-dir results/retrieval/heads --quantisation-per-channel ... --threads 1 \\
        --out-dir results/retrieval/int8 --out results/retrieval/quantisation.csv --provenance P

A model of the recipe's own is acquired by `encoder-study export acquire`, as every other model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ... import provenance


def heads(args) -> int:
    from ...core import files
    from ...encoders import reference
    from . import RetrievalError
    from .heads import COLBERT_FILE, SPARSE_FILE, random_heads, save_heads

    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.inputs.append(args.source)
        model_dir, _ = reference.source_dir(args.source)
        config = files.read_json(model_dir / "config.json", "the model's Hugging Face config",
                                 "acquire the model again", kind=dict, error=RetrievalError)
        width = int(config["hidden_size"])
        frag.outputs += save_heads(random_heads(width, args.seed), args.out_dir)
        frag.note(f"Random heads for a width of {width}: {COLBERT_FILE} weight [{width}, {width}], "
                  f"{SPARSE_FILE} weight [1, {width}], drawn uniformly in ±1/sqrt({width}) from "
                  f"seed {args.seed}, saved as FlagEmbedding saves its heads (torch.save of the state dict).")
    return 0


def export(args) -> int:
    from ...core import files, tables
    from . import check, flagembedding
    from . import export as graph
    from .heads import HEAD_FILES

    settings = graph.Settings(opset=args.opset, tolerance=args.tolerance, threads=args.threads,
                              ort_optimization=args.ort_optimization, external_data=args.external_data,
                              sparse_top_k=args.sparse_top_k)
    out_dir = Path(args.out_dir)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=args.threads) as frag:
        frag.inputs.append(args.source)
        record, rows, memory = graph.export_graph(args.source, args.heads_dir, out_dir, settings)
        if args.heads_dir is not None:
            frag.inputs += [Path(args.heads_dir) / name for name in HEAD_FILES]
        markdown = check.parity_markdown(rows)
        files.write_text(args.parity, tables.csv_text(rows, check.PARITY_COLUMNS))
        files.write_text(args.markdown, markdown + "\n" + check.notes_markdown())
        frag.outputs += [out_dir / e["path"] for e in record["files"]]
        frag.outputs += [out_dir / graph.MANIFEST, args.parity, args.markdown]
        frag.table("Parity of the graph with FlagEmbedding's BGE-M3 code and with the project's reference",
                   markdown)
        for note in check.NOTES:
            frag.note(note)
        frag.table("Cases", tables.markdown(record["check"]["cases"], check.CASE_MARKDOWN))
        frag.table("Memory (resident set: peak VmHWM of each phase, reset at its start)", memory.markdown())
        frag.note(memory.note())
        _notes(frag, record, settings)
        frag.note(f"Reference: {record['check']['references'][flagembedding.NAME]['package']}, class "
                  f"{flagembedding.CLASS} ({flagembedding.MODULE}), imported without running the __init__ "
                  f"of {' and '.join(flagembedding.SKIPPED_INITS)}; settings {flagembedding.SETTINGS}.")
    return 0


def _notes(frag, record: dict, settings) -> None:
    """The fragment's notes on the heads' semantics and the graph's optimisation."""
    from .export import CHECK_OPTIMIZATION
    from .graph import MIN_OPSET

    semantics = record["heads_semantics"]
    frag.note("`sparse`: relu(sparse_linear(hidden)) times the attention mask, max-reduced onto each "
              f"token's vocabulary id by ScatterElements with reduction 'max' (standard from opset "
              f"{MIN_OPSET}); the ids FlagEmbedding ignores are zeroed: "
              + ", ".join(f"{role} {i}" for role, i in semantics["sparse_ignored_ids"].items()) + ".")
    used = [(k, v) for k, v in record["heads"].items() if isinstance(v, dict)]
    frag.note(f"`dense`: {semantics['dense']}. Heads: "
              + ", ".join(f"{k} {v['path']} weight {v['shape']}" for k, v in used))
    frag.note(f"Graph saved after ONNX Runtime's offline optimisation '{settings.ort_optimization}'"
              + (" with external data" if record["optimization"]["external_data"] else "")
              + f"; checked in a session at ONNX Runtime's default level '{CHECK_OPTIMIZATION}', every "
              f"element of every output with allclose(rtol=0, atol={settings.tolerance}).")


def verify(args) -> int:
    """Status 1 and one line per difference on stderr; the fragment only when every file matches."""
    from ...core import files, tables
    from .verify import MANIFEST_WHAT
    from .verify import verify as check_files

    results = {directory: check_files(directory, args.manifest) for directory in args.dirs}
    for problems in results.values():
        for line in problems:
            print(f"verify: {line}", file=sys.stderr)
    if any(results.values()):
        return 1
    lines = []
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        for directory in args.dirs:
            listed = files.read_json(Path(directory) / args.manifest, MANIFEST_WHAT,
                                     "export the graph again")["files"]  # verify has read it
            print(f"{directory}: {len(listed)} files match {args.manifest}")
            lines.append((directory, f"{len(listed)} files match"))
            frag.inputs.append(Path(directory) / args.manifest)
            frag.inputs += [Path(directory) / e["path"] for e in listed]
        frag.table("Verification", tables.markdown_table(["directory", "result"], lines))
    return 0


def quantisation(args) -> int:
    from ...core import settings
    from . import quantise
    from .settings import Quantisation

    gate = settings.from_args(Quantisation, args, "quantisation")
    recorded = settings.recorded(provenance.settings(args), Quantisation, "quantisation")
    with provenance.Fragment(args.provenance, recorded, threads=args.threads) as frag:
        done = frag.add(quantise.quantisation(args.model_dir, args.source, args.heads_dir, gate, args.out_dir,
                                              args.out, args.threads))
    for line in done.said:
        print(line)
    return 0


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="encoder-study retrieval",
                                     description="the three-head retrieval graph: heads, export, verify")
    sub = result.add_subparsers(required=True)

    p = sub.add_parser("heads", help="write random colbert_linear.pt and sparse_linear.pt for a model")
    p.set_defaults(run=heads)
    provenance.add_arguments(p)
    p.add_argument("--source", required=True, help="the model's source.json")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out-dir", required=True, help="results/retrieval/heads")

    p = sub.add_parser("export", help="export, optimise and check the three-head graph")
    p.set_defaults(run=export)
    provenance.add_arguments(p)
    p.add_argument("--source", required=True, help="the model's source.json")
    p.add_argument("--heads-dir", help="directory with colbert_linear.pt and sparse_linear.pt "
                   "(absent: the model's own directory, as in the BGE-M3 snapshot)")
    p.add_argument("--out-dir", required=True, help="results/retrieval/model")
    p.add_argument("--parity", required=True, help="results/retrieval/parity.csv")
    p.add_argument("--markdown", required=True, help="results/retrieval/parity.md")
    p.add_argument("--opset", type=int, required=True)
    p.add_argument("--tolerance", type=float, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ort-optimization", required=True, help="offline: disable, basic or extended")
    p.add_argument("--external-data", required=True, help="auto (graphs over 2 GiB), always or never")
    p.add_argument("--sparse-top-k", type=int, required=True,
                   help="0: the three outputs; k > 0: also sparse_top_ids and sparse_top_weights, each "
                   "text's k largest (id, weight) pairs, checked against the vocabulary-wide row")

    p = sub.add_parser("verify", help="check every file a manifest lists; status 1 naming each difference")
    p.set_defaults(run=verify)
    provenance.add_arguments(p)
    p.add_argument("dirs", nargs="+", help="results/retrieval/model")
    p.add_argument("--manifest", required=True, help="the manifest's name: retrieval.json (export.json for "
                   "plain exports)")

    from ...core import settings
    from .settings import Quantisation

    p = sub.add_parser("quantisation", help="the graph's int8 variant: checked against float32 and "
                       "FlagEmbedding, published within the thresholds")
    p.set_defaults(run=quantisation)
    provenance.add_arguments(p)
    p.add_argument("--model-dir", required=True, help="results/retrieval/model (the float32 graph)")
    p.add_argument("--source", required=True, help="the model's source.json (FlagEmbedding reads it)")
    p.add_argument("--heads-dir", help="colbert_linear.pt and sparse_linear.pt (absent: the model's own)")
    settings.add_options(p.add_argument_group("quantisation"), Quantisation, "quantisation")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--out-dir", required=True, help="results/retrieval/int8 (empty unless published)")
    p.add_argument("--out", required=True, help="results/retrieval/quantisation.csv (a .md beside it)")
    return result
