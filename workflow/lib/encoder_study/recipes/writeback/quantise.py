"""The rules writeback_quantisation and writeback_quantisation_speed: an int8 variant of each written
tagger, made by ONNX Runtime's quantiser (`onnx.quantise`), measured against the float32 written graph
on every split, published beside the pipeline only within the config's thresholds, and timed.

The variant is the written graph quantised whole (the encoder's linear layers and the head: every MatMul
with a weight operand), so it is the same tagger, pooling and argmax included, with int8 weights. What is
measured per split (the gold tokens of dev, test and each extra test set):

- `differing_tokens`: words whose tag differs from the float32 graph's;
- UPOS of both, and int8 minus float32 with a paired sentence bootstrap (`evaluate.paired_difference`,
  the Bootstrap settings of every comparison);
- `logits_max_abs`: the largest |int8 - float32| over every word's logits (`logits_max_value`: the
  largest |float32 logit|, its scale).

Gate: published only when, on every split, float32 UPOS minus int8 UPOS is at most `max_upos_drop`
points and at most `max_differing_percent` percent of the tags differ. The point estimates gate (the
interval is reported beside them): on a few hundred sentences an interval's far end is wider than any
useful threshold. A refusal writes the table and an empty variant folder, and says why in one line.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ... import provenance
from ...core import files, tables
from ...onnx import quantise as quantiser
from ..tagging import evaluate, pipeline, variants
from ..tagging.graph import GraphTagger
from ..tagging.settings import Bootstrap
from ..tagging.variants import Quantisation
from .checks import _encoder_name, write_table

VARIANT = "int8"
OPS = ("MatMul",)  # the tagger's embedding tables stay float32: their lookups cost nothing to speak of
QUANTISATION_COLUMNS = ["run", "encoder", "split", "tokens", "sentences", "differing_tokens",
                        "differing_percent", "upos_float32", "upos_int8", "diff", "ci_low", "ci_high",
                        "logits_max_abs", "logits_max_value", "float32_bytes", "int8_bytes", "size_ratio",
                        "per_channel", "int8_sha256", "published", "decision", "resamples", "seed"]
QUANTISATION_MARKDOWN = (
    ("run", "run", ""), ("split", "split", ""), ("tokens", "tokens", "n"),
    ("differing_tokens", "differing tags", "n"), ("differing_percent", "differing %", ".2f"),
    ("upos_float32", "UPOS float32", ".2f"), ("upos_int8", "UPOS int8", ".2f"),
    ("diff", "int8 - float32", "+.2f"), ("ci", "95% CI", ""), ("logits_max_abs", "logits max abs", ".3g"),
    ("float32_bytes", "float32 bytes", "n"), ("int8_bytes", "int8 bytes", "n"),
    ("published", "published", "yes"))


def variant_graph(written: str | os.PathLike, target: Path, per_channel: bool) -> dict:
    """Quantise the written pipeline's graph into `target`; the quantiser's record."""
    settings, _ = pipeline.read(written)
    return quantiser.quantise(pipeline.graph_path(written, settings), target, per_channel, OPS)


def graph_tagger(written: str | os.PathLike, graph: Path, threads: int) -> GraphTagger:
    """A tagger over `graph` with every setting of the written pipeline `written` (its pooling, windows,
    batches, optimisation and tags): the variant run exactly as the float32 graph is run."""
    settings, _ = pipeline.read(written)
    encoder = settings["encoder"]
    model_dir = Path(written).parent / encoder["model_dir"]
    pipeline.check_files(Path(written), model_dir, encoder["files"])
    s = encoder["settings"]
    return GraphTagger(model_dir, graph, pooling=s["pooling"], max_length=s["max_length"],
                       batch_size=s["batch_size"], threads=threads, optimization=s["optimization"],
                       tags=settings["tags"])


def split_row(run: str, split: str, sentences, float32, int8, bootstrap: Bootstrap) -> dict:
    """A split's row: differing tags, UPOS of both with the paired difference, the logits' difference."""
    docs = [s.doc() for s in sentences]
    gold = [s.upos for s in sentences]
    ours, theirs = int8.predict(docs), float32.predict(docs)
    differing = sum(a != b for p, q in zip(ours, theirs, strict=True) for a, b in zip(p, q, strict=True))
    difference = evaluate.paired_difference(gold, ours, theirs, bootstrap)
    reference = np.concatenate([np.zeros((0, len(float32.tags)), np.float32), *float32.logits(docs)])
    quantised = np.concatenate([np.zeros((0, len(int8.tags)), np.float32), *int8.logits(docs)])
    return {"run": run, "encoder": _encoder_name(float32), "split": split, "tokens": difference.tokens,
            "sentences": difference.sentences, "differing_tokens": differing,
            "differing_percent": 100.0 * differing / max(1, difference.tokens),
            "upos_float32": difference.upos_b, "upos_int8": difference.upos_a, "diff": difference.diff,
            "ci_low": difference.ci_low, "ci_high": difference.ci_high,
            "logits_max_abs": float(np.abs(quantised - reference).max(initial=0.0)),
            "logits_max_value": float(np.abs(reference).max(initial=0.0)),
            "resamples": bootstrap.resamples, "seed": bootstrap.seed}


def refusal(run: str, rows: list[dict], gate: Quantisation) -> str:
    """Why the variant is not published, in one line; empty when every split is within the thresholds."""
    for r in rows:
        drop = r["upos_float32"] - r["upos_int8"]
        if drop > gate.max_upos_drop:
            return (f"{run}: int8 variant not published: on {r['split']} UPOS drops {drop:.2f} points "
                    f"({r['upos_float32']:.2f} -> {r['upos_int8']:.2f}), over "
                    f"writeback.quantisation.max_upos_drop {gate.max_upos_drop:g}")
        if r["differing_percent"] > gate.max_differing_percent:
            return (f"{run}: int8 variant not published: on {r['split']} {r['differing_percent']:.2f}% of "
                    f"the tags differ from float32's ({r['differing_tokens']} of {r['tokens']}), over "
                    f"writeback.quantisation.max_differing_percent {gate.max_differing_percent:g}")
    return ""


def publish(written: str | os.PathLike, int8: GraphTagger, graph: Path, record: dict, rows: list[dict],
            gate: Quantisation, out_dir: Path) -> list[Path]:
    """The variant's pipeline file and graph in `out_dir` (`tagging.variants`), with its manifest."""
    settings, _ = pipeline.read(written)
    training = dict(pipeline.training_summary(written) or {})
    of = {"pipeline": files.file_record(written), "graph": settings["encoder"]["graph"]}
    # The pipeline file's own settings say what it is: the weights' training record, and the variant.
    training["variant"] = {"name": VARIANT, "of": of, "quantisation": {
        k: v for k, v in record.items() if k not in ("bytes", "sha256", "libraries")}}
    saved = pipeline.save_pair(int8, out_dir / Path(written).name, lambda tmp: shutil.copyfile(graph, tmp),
                               training, pipeline.TAGGER_FORMAT)
    manifest = {"variant": VARIANT, "of": of, "quantisation": record,
                "gate": {"max_upos_drop": gate.max_upos_drop,
                         "max_differing_percent": gate.max_differing_percent, "criterion": "every split"},
                "measured": {r["split"]: {k: r[k] for k in ("tokens", "differing_tokens", "upos_float32",
                                                            "upos_int8", "diff", "ci_low", "ci_high",
                                                            "logits_max_abs")} for r in rows},
                "files": [files.file_record(p, out_dir) for p in (saved.path, saved.graph)]}
    files.write_json(out_dir / variants.MANIFEST, manifest)
    return [saved.path, saved.graph, out_dir / variants.MANIFEST]


def quantise_run(run: str, written: str | os.PathLike, splits: dict[str, list], bootstrap: Bootstrap,
                 gate: Quantisation, out_dir: str | os.PathLike, threads: int
                 ) -> tuple[list[dict], provenance.Done]:
    """Make, measure and (within the thresholds) publish one run's int8 variant into `out_dir` (created;
    left empty on a refusal); its rows and what was done."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in files.list_files(out_dir):  # a variant is never left from an earlier decision
        stale.unlink()
    done = provenance.Done(inputs=[Path(written), *(p for p in _graph_inputs(written))])
    float32 = pipeline.load(written, threads=threads)
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=out_dir.parent) as tmp:
        graph = Path(tmp) / pipeline.graph_name(written)
        record = variant_graph(written, graph, gate.per_channel)
        int8 = graph_tagger(written, graph, threads)
        rows = [split_row(run, split, sentences, float32, int8, bootstrap)
                for split, sentences in splits.items()]
        reason = refusal(run, rows, gate)
        float32_bytes = float32.graph.stat().st_size
        for r in rows:
            r.update({"float32_bytes": float32_bytes, "int8_bytes": record["bytes"],
                      "size_ratio": record["bytes"] / float32_bytes, "per_channel": gate.per_channel,
                      "int8_sha256": record["sha256"], "published": not reason,
                      "decision": reason or f"{run}: published: within max_upos_drop {gate.max_upos_drop:g} "
                                            f"and max_differing_percent {gate.max_differing_percent:g} on "
                                            "every split"})
        if reason:
            done.said.append(reason)
        else:
            done.outputs += publish(written, int8, graph, record, rows, gate, out_dir)
            done.said.append(f"{run}: int8 variant published in {out_dir}")
        int8 = None  # the session holds the temporary graph open
    done.note(f"{run}: int8 variant {quantiser.describe(record)}; {done.said[-1]}")
    return rows, done


def _graph_inputs(written: str | os.PathLike) -> list[Path]:
    settings, _ = pipeline.read(written)
    return [pipeline.graph_path(written, settings)]


def quantisation(runs: list[tuple[str, str, str]], splits: dict[str, list], bootstrap: Bootstrap,
                 gate: Quantisation, out: str | os.PathLike, threads: int) -> provenance.Done:
    """Every run's variant (`quantise_run`, into <run's folder>/int8) and the table `out` (.md beside)."""
    done, rows = provenance.Done(), []
    for run, written, out_dir in sorted(runs):
        run_rows, run_done = quantise_run(run, written, splits, bootstrap, gate, out_dir, threads)
        rows += run_rows
        for name in ("inputs", "outputs", "tables", "notes", "said"):
            getattr(done, name).extend(getattr(run_done, name))
    markdown = quantisation_markdown(rows)
    done.outputs += write_table(out, rows, QUANTISATION_COLUMNS, markdown)
    done.table("Int8 variants against the float32 written graphs", markdown)
    done.note(f"per split, the gold tokens; differing tags: words the int8 graph tags otherwise than the "
              f"float32 written graph; int8 - float32: paired sentence bootstrap ({bootstrap.resamples} "
              f"resamples, seed {bootstrap.seed}, {bootstrap.method}, {bootstrap.confidence:g}); gate: "
              f"every split within max_upos_drop {gate.max_upos_drop:g} points and max_differing_percent "
              f"{gate.max_differing_percent:g}% (point estimates); {threads} thread(s)")
    return done


def quantisation_markdown(rows: list[dict]) -> str:
    shown = [{**r, "ci": f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"} for r in rows]
    decisions = sorted({r["decision"] for r in rows})
    return tables.markdown(shown, QUANTISATION_MARKDOWN) + "".join(f"\n- {d}" for d in decisions) + "\n"
