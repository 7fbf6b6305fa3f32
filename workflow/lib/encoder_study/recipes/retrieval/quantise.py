"""The rule retrieval_quantisation: the three-head graph's int8 variant, made by ONNX Runtime's quantiser
(`onnx.quantise`), checked on the validation cases against the float32 graph and against FlagEmbedding,
and published with its manifest only within the config's thresholds.

Per case and reference (`float32`: the published float32 graph's outputs; `flagembedding`: BGE-M3's own
code, ColBERT rows from the second position as in `parity.csv`):

- dense: the cosine of each text's vector with the reference's, least and mean;
- sparse: the share of each text's top-10 ids (of those with a weight above 0; all of them when fewer)
  that the reference's top 10 also holds, least over the texts; and the Pearson correlation of the
  weights at the ids either side keeps, the case's texts pooled (empty where fewer than 3 such ids or
  no spread: a one-word text has one);
- colbert: the cosine of each real token's vector with the reference's, least and 5th percentile.

Gate (`settings.Quantisation`): every case, both references, each measure at or above its threshold.
A refusal writes the table, leaves the variant's folder empty and says why in one line.

Float16 is not made: measured on a CPU with ONNX Runtime 1.32, a float16 graph ran no faster than the
float32 one (docs/recipes.md), so it would only halve the file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ... import provenance
from ...core import files, tables
from ...encoders.reference import source_dir
from ...onnx import quantise as quantiser
from ...onnx.manifest import ONNX_FILE
from ...onnx.runtime import ort_session
from . import OUTPUTS, RetrievalError, flagembedding
from .cases import max_length
from .export import CHECK_OPTIMIZATION, MANIFEST, _parts
from .settings import Quantisation
from .verify import verify

VARIANT = "int8"
FLOAT32 = "float32"  # the table's reference for the float32 graph
TOP = 10
COLUMNS = ["case", "reference", "rows", "tokens", "dense_cos_min", "dense_cos_mean", "sparse_top10_min",
           "sparse_correlation", "colbert_cos_min", "colbert_cos_p5", "passed", "float32_bytes", "int8_bytes",
           "size_ratio", "per_channel", "embeddings", "int8_sha256", "published", "decision"]
MARKDOWN = (("case", "case", ""), ("reference", "reference", ""), ("rows", "texts", "n"),
            ("tokens", "tokens", "n"), ("dense_cos_min", "dense cos min", ".6f"),
            ("dense_cos_mean", "dense cos mean", ".6f"), ("sparse_top10_min", "sparse top-10 min", ".2f"),
            ("sparse_correlation", "sparse corr", ".4f"), ("colbert_cos_min", "colbert cos min", ".4f"),
            ("colbert_cos_p5", "colbert cos p5", ".4f"), ("passed", "within", "yes"))
# Threshold field -> the measure it holds down (the gate's order: the first failure is the one said).
GATED = (("min_dense_cosine", "dense_cos_min"), ("min_sparse_top10", "sparse_top10_min"),
         ("min_sparse_correlation", "sparse_correlation"), ("min_colbert_cosine", "colbert_cos_min"),
         ("min_colbert_cosine_p5", "colbert_cos_p5"))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(norms, 1e-30)


def _top(row: np.ndarray, k: int = TOP) -> set[int]:
    kept = np.flatnonzero(row > 0)
    return set(kept[np.argsort(-row[kept], kind="stable")[:k]].tolist())


def top_agreement(got: np.ndarray, want: np.ndarray) -> float:
    """The least share, over the texts, of the reference's top ids that the variant's top ids hold (1.0
    where neither keeps an id)."""
    shares = []
    for a, b in zip(got, want, strict=True):
        ours, theirs = _top(a), _top(b)
        shares.append(len(ours & theirs) / max(len(ours), len(theirs)) if ours or theirs else 1.0)
    return min(shares)


def sparse_correlation(got: np.ndarray, want: np.ndarray) -> float | None:
    """Pearson's r of the weights at the ids either keeps (texts pooled); None where undefined."""
    kept = (got > 0) | (want > 0)
    a, b = got[kept].astype(np.float64), want[kept].astype(np.float64)
    if a.size < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def measures(got: dict[str, np.ndarray], want: dict[str, np.ndarray], colbert_got: np.ndarray,
             colbert_want: np.ndarray) -> dict:
    """One row's measures of the variant's outputs `got` against a reference's `want` (ColBERT: the
    vectors of the tokens compared, [tokens, dim] each)."""
    dense = _cosines(got["dense"], want["dense"])
    colbert = _cosines(colbert_got, colbert_want)
    return {"dense_cos_min": float(dense.min()), "dense_cos_mean": float(dense.mean()),
            "sparse_top10_min": top_agreement(got["sparse"], want["sparse"]),
            "sparse_correlation": sparse_correlation(got["sparse"], want["sparse"]),
            "colbert_cos_min": float(colbert.min()), "colbert_cos_p5": float(np.percentile(colbert, 5))}


def failures(row: dict, gate: Quantisation) -> list[str]:
    """The thresholds a row misses, in words."""
    out = []
    for field, column in GATED:
        value = row[column]
        if value is not None and value < getattr(gate, field):
            out.append(f"{column} {value:.4f} < {field} {getattr(gate, field):g}")
    return out


def _run(session, case) -> dict[str, np.ndarray]:
    got = session.run(list(OUTPUTS), {"input_ids": case.input_ids, "attention_mask": case.attention_mask})
    return dict(zip(OUTPUTS, got, strict=True))


def quantisation(model_dir: str | os.PathLike, source_json: str | os.PathLike,
                 heads_dir: str | os.PathLike | None, gate: Quantisation, out_dir: str | os.PathLike,
                 out: str | os.PathLike, threads: int) -> provenance.Done:
    """Make, check and (within `gate`) publish the int8 variant of the published graph in `model_dir` into
    `out_dir` (created; empty on a refusal); the table `out` (.md beside)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    float32_manifest = files.read_json(model_dir / MANIFEST, "the retrieval graph's manifest",
                                       "export the graph again", kind=dict, error=RetrievalError)
    problems = verify(model_dir, MANIFEST)
    if problems:
        raise RetrievalError(f"{model_dir}: the float32 graph does not match its manifest: {problems[0]}")
    done = provenance.Done(inputs=[Path(source_json), model_dir / MANIFEST,
                                   *(model_dir / e["path"] for e in float32_manifest["files"])])
    source_model, _ = source_dir(source_json)
    parts = _parts(source_model, heads_dir)
    if heads_dir is not None:
        done.inputs += sorted(parts.heads.files.values())
    theirs = flagembedding.reference(source_model, parts.heads.files, parts.ignored, parts.cases,
                                     max_length(parts.config), int(parts.config.vocab_size))
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in files.list_files(out_dir):  # a variant is never left from an earlier decision
        stale.unlink()
    float32_bytes = quantiser.graph_bytes(model_dir / ONNX_FILE)
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=out_dir.parent) as tmp:
        graph = Path(tmp) / ONNX_FILE
        ops = ("MatMul", "Gather") if gate.embeddings else ("MatMul",)
        record = quantiser.quantise(model_dir / ONNX_FILE, graph, gate.per_channel, ops)
        reference = ort_session(model_dir / ONNX_FILE, threads, CHECK_OPTIMIZATION)
        variant = ort_session(graph, threads, CHECK_OPTIMIZATION)
        rows = []
        for case, want_fe in zip(parts.cases, theirs, strict=True):
            got, want = _run(variant, case), _run(reference, case)
            real = case.attention_mask == 1
            shape = {"case": case.name, "rows": int(case.input_ids.shape[0]), "tokens": int(real.sum())}
            rows.append({**shape, "reference": FLOAT32,
                         **measures(got, want, got["colbert"][real], want["colbert"][real])})
            view = flagembedding.graph_view(got, case.attention_mask)
            rows.append({**shape, "reference": flagembedding.NAME,
                         **measures(view, want_fe, view["colbert"], want_fe["colbert"])})
        variant = reference = None
        missed = [(r, failures(r, gate)) for r in rows]
        first = next(((r, f) for r, f in missed if f), None)
        reason = (f"retrieval int8 variant not published: case {first[0]['case']} against "
                  f"{first[0]['reference']}: {first[1][0]} (retrieval.quantisation)" if first else "")
        for r, f in missed:
            r.update({"passed": not f, "float32_bytes": float32_bytes, "int8_bytes": record["bytes"],
                      "size_ratio": record["bytes"] / float32_bytes, "per_channel": gate.per_channel,
                      "embeddings": gate.embeddings, "int8_sha256": record["sha256"], "published": not reason,
                      "decision": reason or "published: every case within every threshold, against both"})
        if reason:
            done.said.append(reason)
        else:
            done.outputs += _publish(model_dir, graph, float32_manifest, record, rows, gate, out_dir)
            done.said.append(f"retrieval int8 variant published in {out_dir}")
    markdown = quantisation_markdown(rows)
    files.write_text(out, tables.csv_text(rows, COLUMNS))
    files.write_text(Path(out).with_suffix(".md"), markdown)
    done.outputs += [Path(out), Path(out).with_suffix(".md")]
    done.table("The retrieval graph's int8 variant against float32 and FlagEmbedding", markdown)
    done.note(f"int8 variant {quantiser.describe(record)}: {record['bytes'] / float32_bytes:.2f} of "
              f"float32's {float32_bytes:,} bytes, one file without external data; {done.said[-1]}")
    done.note(f"sessions at ONNX Runtime's level '{CHECK_OPTIMIZATION}', {threads} thread(s); sparse top-10: "
              "the least share over a case's texts; correlation over the ids either keeps, texts pooled, "
              "empty where undefined (not gated); ColBERT: every real token (against FlagEmbedding from the "
              "second)")
    return done


def _publish(model_dir: Path, graph: Path, float32_manifest: dict, record: dict, rows: list[dict],
             gate: Quantisation, out_dir: Path) -> list[Path]:
    """The variant's folder: the int8 graph, the float32 graph's tokenizer and config, and retrieval.json
    (the float32 manifest's facts, the variant's, every file with its SHA-256), checked once written."""
    shutil.copyfile(graph, out_dir / ONNX_FILE)
    kept = [e["path"] for e in float32_manifest["files"] if e["path"] not in (ONNX_FILE, ONNX_FILE + ".data")]
    for name in kept:
        shutil.copyfile(model_dir / name, out_dir / name)
    manifest = {k: v for k, v in float32_manifest.items() if k != "files"}
    manifest["optimization"] = {**manifest.get("optimization", {}), "external_data": False}
    manifest["variant"] = {
        "name": VARIANT,
        "of": {"manifest": files.file_record(model_dir / MANIFEST),
               "graph": next(e for e in float32_manifest["files"] if e["path"] == ONNX_FILE)},
        "quantisation": record,
        "gate": {**{field: getattr(gate, field) for field, _ in GATED},
                 "criterion": "every case, against float32 and against FlagEmbedding"},
        "measured": {f"{r['case']}/{r['reference']}": {c: r[c] for _, c in GATED} for r in rows}}
    written = [out_dir / ONNX_FILE, *(out_dir / name for name in kept)]
    manifest["files"] = [files.file_record(p, out_dir) for p in written]
    files.write_json(out_dir / MANIFEST, manifest)
    problems = verify(out_dir, MANIFEST)
    if problems:
        raise RetrievalError(f"{out_dir}: the published variant does not match its manifest: {problems[0]}")
    return [*written, out_dir / MANIFEST]


def quantisation_markdown(rows: list[dict]) -> str:
    decision = rows[0]["decision"] if rows else ""
    first = rows[0] if rows else {}
    sizes = (f"\nfloat32 {int(first['float32_bytes']):,} bytes, int8 {int(first['int8_bytes']):,} bytes "
             f"({float(first['size_ratio']):.2f}); per_channel {first['per_channel']}, embeddings "
             f"{first['embeddings']}.\n" if rows else "")
    return tables.markdown(rows, MARKDOWN) + sizes + (f"\n- {decision}\n" if decision else "")
