"""Retrieval heads baked into one graph: the dense, sparse and multi-vector outputs of a BGE-M3-style encoder.

A standard export stops at `last_hidden_state`; BGE-M3's three retrieval signals are Python around it
(FlagEmbedding's BGE-M3 model). Here they go inside the ONNX graph, so one forward pass in any runtime
gives all three. Inputs `input_ids`, `attention_mask` (int64, [batch, sequence]); outputs:

- `dense` [batch, width]: the first token's hidden state, L2-normalised (CLS pooling).
- `sparse` [batch, vocab]: relu(sparse_linear(hidden)) per token, times the attention mask, max-reduced
  onto each token's vocabulary id inside the graph (ScatterElements with reduction "max"); the ids
  FlagEmbedding ignores (cls, eos, pad, unk) are zeroed, so they contribute nothing.
- `colbert` [batch, sequence, dim]: colbert_linear(hidden), L2-normalised, times the mask. Unlike
  FlagEmbedding (`hidden[:, 1:]`) the first position is kept, so the output is as long as the mask.

The heads are FlagEmbedding's files `colbert_linear.pt` and `sparse_linear.pt` (state dicts with
`weight` [out, width] and `bias` [out]); the embedded default makes random ones from a seed.
The graph (after the recipe's offline ONNX Runtime optimisation) is checked against a plain PyTorch
reference on fixed cases before the output directory, written under a temporary name, is renamed
into place. `retrieval.json` lists every file with its SHA-256; `verify` checks them without
running anything.

Memory. BGE-M3 reads 8,192 pieces, and the check runs a text that long. Eager attention holds a
[batch, heads, sequence, sequence] score tensor, 4 GiB at 16 x 8192 x 8192 in float32, and ONNX Runtime
two of them at once (the scores and the softmax); with the model in both PyTorch and ONNX Runtime that
took the export of a model of BGE-M3's shape to about ten times the model's size (measured:
CHANGELOG.md). So:
- the graph computes attention one head at a time (the same arithmetic as transformers' eager attention,
  head by head): a consumer's peak at 8,192 pieces is one head's scores, 256 MiB, not 16 heads', and
  short inputs run as fast;
- the reference runs PyTorch's scaled_dot_product_attention (a fused kernel that never holds all the
  scores), a different implementation from the graph's;
- the reference is computed for every case before the export, and the PyTorch model is freed before ONNX
  Runtime loads the graph, so that the two copies of the weights are never resident together;
- each phase's peak resident set is measured (`machine.peak_resident_kib`) and reported against the
  graph's size on disk.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import files, machine, provenance, runtime, tables
from .errors import UserError
from .onnx import checked_export
from .reference import HiddenStates, load_pytorch, source_dir
from .runtime import ort_session, usable_positions

OUTPUTS = ("dense", "sparse", "colbert")
MANIFEST = "retrieval.json"
MANIFEST_WHAT = "a manifest with a 'files' list"
ONNX_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "model.config.json"
COLBERT_FILE = "colbert_linear.pt"
SPARSE_FILE = "sparse_linear.pt"
# ScatterElements gained reduction="max" in opset 18; older opsets only define none/add/mul. ONNX
# Runtime accepts "max" at 16 and 17 too, but a runtime that follows the standard may refuse it.
MIN_OPSET = 18
# Protobuf cannot hold a message of 2 GiB; leave room for the graph itself beside the weights.
EXTERNAL_DATA_BYTES = 2**31 - 2**26
OFFLINE_OPTIMIZATIONS = ("disable", "basic", "extended")
CHECK_OPTIMIZATION = "all"  # ONNX Runtime's default: what a consumer of the file gets
PARITY_COLUMNS = ["case", "output", "rows", "tokens", "max_abs", "max_value", "allclose", "tolerance"]
# results/retrieval/parity.md. ".0f" prints a count and "g" the tolerance as str() does (for a
# tolerance of up to 6 significant digits), aligned right.
PARITY_MARKDOWN = (("case", "case", ""), ("output", "output", ""), ("rows", "rows", ".0f"),
                   ("tokens", "tokens", ".0f"), ("max_abs", "max_abs", ".3g"),
                   ("max_value", "max_value", ".4g"), ("allclose", "allclose", "yes"),
                   ("tolerance", "tolerance", "g"))
# The validation cases, as `retrieval export` lists them in its fragment.
CASE_MARKDOWN = (("name", "case", ""), ("purpose", "what it checks", ""), ("rows", "rows", ".0f"),
                 ("tokens", "tokens", ".0f"))
# The outputs' dynamic axes, in OUTPUTS' order (the inputs' are every export's).
OUTPUT_AXES = {"dense": {0: "batch"}, "sparse": {0: "batch"}, "colbert": {0: "batch", 1: "sequence"}}
COLBERT_NOTE = (
    "`colbert` keeps the first position, where FlagEmbedding computes `colbert_linear(hidden[:, 1:])`: "
    "with one vector per position, a consumer that trims each row of a padded batch to the attention "
    "mask's sum gets exactly the text's vectors, instead of one more than the output holds. The first "
    "vector (of `<s>`) is a summary of the whole text, harmless in late interaction; drop row 0 to get "
    "FlagEmbedding's vectors.")


class RetrievalError(UserError):
    pass


# --- heads ----------------------------------------------------------------------------------------

@dataclass
class Heads:
    """The two linear heads; weights in float32 whatever dtype their files hold (BGE-M3's are fp16)."""

    colbert: torch.nn.Linear
    sparse: torch.nn.Linear
    files: dict[str, Path] = field(default_factory=dict)


def random_heads(width: int, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """State dicts for both heads, drawn like torch.nn.Linear's default (uniform in ±1/sqrt(width))."""
    generator = torch.Generator().manual_seed(seed)
    bound = 1.0 / width**0.5

    def draw(*shape: int) -> torch.Tensor:
        return (torch.rand(shape, generator=generator) * 2 - 1) * bound

    return {
        COLBERT_FILE: {"weight": draw(width, width), "bias": draw(width)},
        SPARSE_FILE: {"weight": draw(1, width), "bias": draw(1)},
    }


def save_heads(state: dict[str, dict[str, torch.Tensor]], out_dir: str | os.PathLike) -> list[Path]:
    """Write each head as FlagEmbedding does (`torch.save(linear.state_dict(), name)`), atomically."""
    out_dir = Path(out_dir)
    written = []
    for name, tensors in sorted(state.items()):
        files.write_torch(out_dir / name, {k: v.contiguous() for k, v in tensors.items()})
        written.append(out_dir / name)
    return written


def _linear(path: Path, width: int, out: int | None) -> torch.nn.Linear:
    """A head from its state dict; `out` None accepts any output size (the ColBERT dimension)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        raise RetrievalError(f"head {path} is missing") from err
    except Exception as err:  # a pickle that is not a plain state dict, or not a torch file at all
        raise RetrievalError(f"head {path}: cannot read it as a state dict ({err})") from err
    if not isinstance(state, dict) or not {"weight", "bias"} <= set(state):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise RetrievalError(f"head {path}: expected a state dict with 'weight' and 'bias', found {keys}")
    weight = state["weight"].float()
    bias = state["bias"].float().reshape(-1)
    if weight.ndim == 1:  # a one-output head saved as a vector
        weight = weight.reshape(1, -1)
    if weight.ndim != 2 or weight.shape[1] != width or bias.shape[0] != weight.shape[0] or (
            out is not None and weight.shape[0] != out):
        want = f"[{out if out is not None else 'dim'}, {width}]"
        raise RetrievalError(f"head {path}: weight {list(state['weight'].shape)} and bias "
                             f"{list(state['bias'].shape)} do not fit the encoder: expected weight {want}")
    linear = torch.nn.Linear(width, weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return linear.eval()


def load_heads(heads_dir: str | os.PathLike, width: int) -> Heads:
    heads_dir = Path(heads_dir)
    colbert, sparse = heads_dir / COLBERT_FILE, heads_dir / SPARSE_FILE
    return Heads(colbert=_linear(colbert, width, None), sparse=_linear(sparse, width, 1),
                 files={"colbert": colbert, "sparse": sparse})


# --- the graph ------------------------------------------------------------------------------------

def ignored_ids(model_dir: str | os.PathLike, config) -> dict[str, int]:
    """The ids FlagEmbedding's sparse head ignores: cls, eos, pad and unk, as role -> id."""
    tokenizer = files.read_json(Path(model_dir) / "tokenizer.json", "the model's tokenizer (tokenizers' "
                                "JSON)", "acquire the model again", kind=dict, error=RetrievalError)
    model = tokenizer.get("model", {})
    unk = model.get("unk_id")  # Unigram keeps an id, WordPiece and BPE a piece
    if unk is None and model.get("unk_token") is not None:
        unk = model.get("vocab", {}).get(model["unk_token"])

    def first(*names: str):
        return next((v for n in names if (v := getattr(config, n, None)) is not None), None)

    # XLM-R's config names <s> bos_token_id and </s> eos_token_id; BERT-style configs use cls/sep.
    roles = {"cls": first("cls_token_id", "bos_token_id"), "eos": first("eos_token_id", "sep_token_id"),
             "pad": first("pad_token_id"), "unk": unk}
    missing = [role for role, value in roles.items() if value is None]
    if missing:
        raise RetrievalError(f"{model_dir}: cannot find the id of {', '.join(missing)} in config.json or "
                             "tokenizer.json; the sparse head must know which ids to ignore")
    return {role: int(value) for role, value in roles.items()}


class _ScatterMax(torch.autograd.Function):
    """torch.scatter_reduce(..., reduce="amax"), out of place, exported as one ScatterElements node.

    The stock symbolic wraps the node in two `If`s for rank-0 tensors, which leaves the output's rank
    unknown (ONNX Runtime then warns on every run); our tensors are always [batch, vocab].
    Inference only: there is no backward.
    """

    @staticmethod
    def forward(ctx, base: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.scatter_reduce(base, 1, index, src, reduce="amax")

    @staticmethod
    def symbolic(g, base, index, src):
        return g.op("ScatterElements", base, index, src, axis_i=1, reduction_s="max")


PER_HEAD_ATTENTION = "encoder_study_per_head"  # registered with transformers' attention interfaces
REFERENCE_ATTENTION = "sdpa"


def per_head_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None,
                       dropout: float = 0.0, **kwargs):
    """transformers' eager attention ([batch, heads, sequence, head_dim] in, [batch, sequence, heads,
    head_dim] out), one head at a time: the exported graph then holds one head's scores at a time.

    Inference only (no dropout); the attention weights are not returned.
    """
    if key.shape[1] != query.shape[1]:
        raise RetrievalError(f"attention with {query.shape[1]} query heads and {key.shape[1]} key heads: "
                             "the per-head export supports only as many key heads as query heads")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    outputs = []
    for head in range(query.shape[1]):  # the head count is fixed: the traced graph has one chain per head
        one = slice(head, head + 1)
        scores = torch.matmul(query[:, one], key[:, one].transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask  # [batch, 1, query, key]: the same for every head
        outputs.append(torch.matmul(torch.softmax(scores, dim=-1), value[:, one]))
    return torch.cat(outputs, dim=1).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def attention(encoder: torch.nn.Module, implementation: str):
    """Run `encoder` with another of transformers' attention implementations inside the block:
    PER_HEAD_ATTENTION (with eager attention's additive mask) or one of transformers' own ("sdpa")."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    if implementation == PER_HEAD_ATTENTION:
        AttentionInterface.register(PER_HEAD_ATTENTION, per_head_attention)
        AttentionMaskInterface.register(PER_HEAD_ATTENTION, eager_mask)
    before = encoder.config._attn_implementation
    encoder.config._attn_implementation = implementation
    try:
        yield encoder
    finally:
        encoder.config._attn_implementation = before


class RetrievalModel(torch.nn.Module):
    """`forward(input_ids, attention_mask) -> (dense, sparse, colbert)`: the module that is exported."""

    def __init__(self, encoder: torch.nn.Module, heads: Heads, vocab_size: int, ignored: list[int]):
        super().__init__()
        self.encoder = HiddenStates(encoder)
        self.colbert = heads.colbert
        self.sparse = heads.sparse
        self.vocab_size = int(vocab_size)
        keep = torch.ones(self.vocab_size)
        keep[sorted(set(ignored))] = 0.0
        self.register_buffer("keep", keep, persistent=False)  # 0 at ignored ids, 1 elsewhere

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.encoder(input_ids, attention_mask)
        mask = attention_mask.to(hidden.dtype)
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        weights = torch.relu(self.sparse(hidden)).squeeze(-1) * mask
        base = torch.zeros(input_ids.shape[0], self.vocab_size, dtype=weights.dtype)
        sparse = _ScatterMax.apply(base, input_ids, weights) * self.keep
        colbert = torch.nn.functional.normalize(self.colbert(hidden), dim=-1) * mask.unsqueeze(-1)
        return dense, sparse, colbert


def reference(encoder: torch.nn.Module, heads: Heads, ignored: list[int], input_ids: np.ndarray,
              mask: np.ndarray) -> dict[str, np.ndarray]:
    """The three heads in plain PyTorch and Python, written as FlagEmbedding reads.

    Shares only the encoder's weights with the graph: the encoder runs with PyTorch's
    scaled_dot_product_attention (the graph computes eager attention head by head), and the sparse
    weights are max-reduced by a loop over tokens. The encoder runs in float32, as the graph does; the
    heads run in float64 on its output, so that their own rounding is not in the differences the check
    measures (at 8,192 pieces of width 1024 that is 64 MiB: the float64 is not where the memory goes).
    """
    with torch.no_grad(), attention(encoder, REFERENCE_ATTENTION):
        hidden = encoder(input_ids=torch.from_numpy(input_ids),
                         attention_mask=torch.from_numpy(mask)).last_hidden_state.double()
        m = torch.from_numpy(mask).double()
        first = hidden[:, 0]
        dense = first / first.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        weights = torch.relu(hidden @ heads.sparse.weight.double().T + heads.sparse.bias.double())[..., 0]
        vectors = hidden @ heads.colbert.weight.double().T + heads.colbert.bias.double()
        colbert = vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-12) * m.unsqueeze(-1)
    vocab = encoder.config.vocab_size
    sparse = np.zeros((input_ids.shape[0], vocab))
    for row in range(input_ids.shape[0]):
        for token, weight, real in zip(input_ids[row], weights[row].tolist(), mask[row], strict=True):
            if real:
                sparse[row, token] = max(sparse[row, token], weight)
    sparse[:, sorted(set(ignored))] = 0.0
    return {"dense": dense.numpy(), "sparse": sparse, "colbert": colbert.numpy()}


# --- validation cases -----------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    purpose: str
    input_ids: np.ndarray
    attention_mask: np.ndarray


ENGLISH = ("The committee met on Tuesday to review the budget, and most members agreed that the bank of "
           "the river needs work before the winter floods arrive.")
LANGUAGES = [
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",                 # Czech: Latin with diacritics
    "Съешь же ещё этих мягких французских булок.",            # Russian: Cyrillic
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",                      # Greek
    "שלום לכולם, מה שלומכם היום?",                               # Hebrew: right to left
    "مرحبا بالجميع، كيف حالكم اليوم؟",                          # Arabic: right to left, joined letters
    "नमस्ते, आज मौसम बहुत अच्छा है।",                                   # Hindi: Devanagari
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",                                 # Thai: no spaces between words
    "日本語の文字と한국어 문장",                                  # Japanese and Korean
]
REPEATED = ("the bank is a bank, the house is a house, the duck is a duck, and the river bank runs "
            "into the river")
UNKNOWN = "Symbols such as ☃ ⌘ ♞ and 🙂🚀 are rare in any vocabulary."
BATCH = [
    "A short one.",
    "The second sentence of the batch is a good deal longer than the first, with many more pieces.",
    "Third.",
    "Padding changes results in ways that single inputs never show, so a batch is checked as well.",
]


def _encode(tokenizer, texts: list[str], max_length: int, pad_id: int, pad_to: int = 0
            ) -> tuple[np.ndarray, np.ndarray]:
    tokenizer.enable_truncation(max_length=max_length)
    rows = [tokenizer.encode(t).ids for t in texts]
    return runtime.pad_batch(rows, pad_id, pad_to)


def parity_cases(tokenizer_path: str | os.PathLike, config) -> list[Case]:
    """The validation cases: each a right-padded batch the graph and the reference both run."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    longest = usable_positions(config.to_dict()) or 512
    pad = config.pad_token_id if config.pad_token_id is not None else 0

    def make(name: str, purpose: str, texts: list[str], pad_to: int = 0) -> Case:
        ids, mask = _encode(tokenizer, texts, longest, pad, pad_to)
        return Case(name, purpose, ids, mask)

    tokenizer.no_truncation()
    paragraph = " ".join([ENGLISH, *LANGUAGES, REPEATED]) + " "
    per_copy = max(1, len(tokenizer.encode(paragraph).ids) - 2)
    long_text = paragraph * (longest // per_copy + 2)
    english_ids = len(tokenizer.encode(ENGLISH).ids)
    cases = [
        make("english", "ordinary English", [ENGLISH]),
        make("short", "a one-word text", ["Yes"]),
        make("empty", "an empty text: only the special tokens", [""]),
        make("long", f"the model's maximum length ({longest} pieces)", [long_text]),
        make("multilingual", f"{len(LANGUAGES)} languages in several scripts, one padded batch", LANGUAGES),
        make("repeated", "repeated pieces: one weight per id, the largest (max reduction)", [REPEATED]),
        make("unknown", "characters a vocabulary may lack (unknown pieces are ignored)", [UNKNOWN]),
        make("padding_tail", "one text followed by a padding-only tail",
             [ENGLISH], pad_to=min(longest, 3 * english_ids)),
        make("batch", "sentences of different lengths in one padded batch", BATCH),
    ]
    long = cases[3]
    if int(long.attention_mask.sum()) != longest:
        raise RetrievalError(f"{tokenizer_path}: the long case has {int(long.attention_mask.sum())} pieces, "
                             f"expected the maximum {longest}")
    return cases


def compare(case: Case, got: dict[str, np.ndarray], want: dict[str, np.ndarray], tolerance: float
            ) -> list[dict]:
    """One row per output: the largest absolute difference and allclose(rtol=0, atol=tolerance)."""
    rows = []
    for name in OUTPUTS:
        a, b = np.asarray(got[name], dtype=np.float64), np.asarray(want[name], dtype=np.float64)
        if a.shape != b.shape:
            raise RetrievalError(f"case {case.name}: output {name} has shape {list(a.shape)}, the reference "
                                 f"{list(b.shape)}")
        rows.append({
            "case": case.name, "output": name, "rows": int(case.input_ids.shape[0]),
            "tokens": int(case.attention_mask.sum()), "max_abs": float(np.abs(a - b).max()),
            "max_value": float(np.abs(b).max()),
            "allclose": bool(np.allclose(a, b, rtol=0.0, atol=tolerance)), "tolerance": tolerance,
        })
    return rows


def parity_markdown(rows: list[dict]) -> str:
    return tables.markdown(rows, PARITY_MARKDOWN)


# --- export ---------------------------------------------------------------------------------------

EXTERNAL_DATA = ("auto", "always", "never")
MEMORY_MARKDOWN = (("phase", "phase", ""), ("resident_before_mib", "resident before (MiB)", ".1f"),
                   ("peak_mib", "peak (MiB)", ".1f"), ("seconds", "seconds", ".1f"))


@dataclass
class Memory:
    """The peak resident set of each phase of `export_graph` (VmHWM, reset at each phase's start), its
    time, and the published graph's size on disk (model.onnx and its external data). Not in the
    manifest: it varies from run to run."""

    phases: list[dict] = field(default_factory=list)
    reset: bool = True  # False: a peak could not be reset, so each is the peak since the process began
    model_bytes: int = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        self.reset = machine.reset_peak() and self.reset
        before, start = machine.resident_kib(), time.perf_counter()
        yield
        self.phases.append({"phase": name, "resident_before_mib": before / 1024,
                            "peak_mib": machine.peak_resident_kib() / 1024,
                            "seconds": time.perf_counter() - start})

    @property
    def peak(self) -> dict:
        return max(self.phases, key=lambda p: p["peak_mib"])

    def markdown(self) -> str:
        return tables.markdown(self.phases, MEMORY_MARKDOWN)

    def note(self) -> str:
        """One line for the fragment: the peak, where it was, and its ratio to the graph's size."""
        peak = self.peak
        mib, size_mib = peak["peak_mib"], self.model_bytes / 2**20
        reset = ("each phase's peak was reset at its start (/proc/self/clear_refs)" if self.reset
                 else "the peak could not be reset: each is the peak since the process began")
        return (f"peak memory of the export: {mib:.1f} MiB resident at most (in \"{peak['phase']}\"), "
                f"{mib / size_mib:.2f} x the graph's {self.model_bytes:,} bytes ({size_mib:.1f} MiB) on disk "
                "(model.onnx and any external data); the whole process, Python and its libraries included; "
                + reset)


@dataclass(frozen=True)
class Settings:
    """The recipe's settings (config `retrieval`; the schema holds their defaults)."""

    opset: int
    tolerance: float  # allclose(rtol=0, atol=tolerance) on every element of every output
    threads: int
    ort_optimization: str  # applied offline (OFFLINE_OPTIMIZATIONS); the published graph is the optimised one
    external_data: str  # auto: only graphs too large for one protobuf; always; never


def _declare_outputs(path: Path, shapes: dict[str, list]) -> None:
    """Name or fix every output dimension; the exporter cannot infer the custom scatter's."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        for dim, value in zip(dims, shapes[output.name], strict=True):
            if isinstance(value, int):
                dim.dim_value = value
            else:
                dim.dim_param = value
    onnx.save_model(model, str(path))


def _drop_unused_domains(path: Path) -> None:
    """Keep only the operator sets the graph uses.

    ONNX Runtime saves an import of each of its own domains (com.microsoft, ...) even when no node
    uses them; a runtime without those domains need not be asked to know them.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    used = {"", "ai.onnx"}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            used.add(node.domain)
            for attribute in node.attribute:
                graphs += ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
    keep = [o for o in model.opset_import if o.domain in used]
    if len(keep) < len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)
        onnx.save_model(model, str(path))


def _external(raw_dir: Path, setting: str) -> bool:
    size = sum(p.stat().st_size for p in files.list_files(raw_dir))
    return setting == "always" or (setting == "auto" and size >= EXTERNAL_DATA_BYTES)


def _write_graph(raw: Path, target: Path, level: str, external: bool, threads: int) -> None:
    """Save the graph `raw` as `target` after ONNX Runtime's offline optimisation at `level`.

    With external data every initializer of 1 KiB or more goes to one file, DATA_FILE, beside it.
    """
    import onnx
    import onnxruntime as ort

    if level == "disable":
        model = onnx.load(str(raw))
        onnx.save_model(model, str(target), save_as_external_data=external, all_tensors_to_one_file=True,
                        location=DATA_FILE, size_threshold=1024)
        return
    options = runtime.session_options(threads, level)
    options.optimized_model_filepath = str(target)
    if external:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         "1024")
    ort.InferenceSession(str(raw), options, providers=["CPUExecutionProvider"])


def _check_settings(settings: Settings) -> None:
    if settings.opset < MIN_OPSET:
        raise RetrievalError(f"opset {settings.opset}: ScatterElements has reduction 'max' only from opset "
                             f"{MIN_OPSET}; use --opset {MIN_OPSET} or later")
    if settings.ort_optimization not in OFFLINE_OPTIMIZATIONS:
        raise RetrievalError(f"offline optimisation {settings.ort_optimization!r}: use one of "
                             f"{', '.join(OFFLINE_OPTIMIZATIONS)} (a graph saved after 'all' is tied to the "
                             "machine that made it)")
    if settings.external_data not in EXTERNAL_DATA:
        raise RetrievalError(f"external data {settings.external_data!r}: use one of "
                             f"{', '.join(EXTERNAL_DATA)}")


def _trace(encoder: torch.nn.Module, heads: Heads, ignored: list[int], case: Case, raw: Path, opset: int
           ) -> None:
    """The three-head graph, traced on `case` with attention one head at a time, as `raw` (and, over
    2 GiB, its weights as files beside it, one per tensor; `_write_graph` gathers them)."""
    graph = RetrievalModel(encoder, heads, encoder.config.vocab_size, ignored).eval()
    with attention(encoder, PER_HEAD_ATTENTION):
        checked_export.trace(graph, (case.input_ids, case.attention_mask), raw, opset, OUTPUT_AXES,
                             external_data=True)


def _optimise(raw: Path, target: Path, shapes: dict[str, list], settings: Settings, threads: int) -> bool:
    """Check the traced graph `raw`, save it optimised offline as `target` (with external data when
    the setting asks for it) and check that; remove `raw`'s directory; return whether it has external
    data."""
    _declare_outputs(raw, shapes)
    checked_export.check_graph(raw)
    external = _external(raw.parent, settings.external_data)
    _write_graph(raw, target, settings.ort_optimization, external, threads)
    shutil.rmtree(raw.parent)
    _drop_unused_domains(target)
    if settings.ort_optimization != "extended":  # extended adds ONNX Runtime's own operators
        checked_export.check_graph(target)
    return external


def _check_cases(path: Path, cases: list[Case], wants: list, tolerance: float, threads: int, model: str
                 ) -> list[dict]:
    """The parity rows of the graph `path` of `model` in ONNX Runtime against each case's reference in
    `wants` (freed one by one as they are used); RetrievalError unless every row is within `tolerance`."""
    session = ort_session(path, threads, CHECK_OPTIMIZATION)
    rows = []
    for index, case in enumerate(cases):
        got = session.run(list(OUTPUTS), {"input_ids": case.input_ids, "attention_mask": case.attention_mask})
        rows += compare(case, dict(zip(OUTPUTS, got, strict=True)), wants[index], tolerance)
        wants[index] = got = None  # freed before the next case
    failed = [r for r in rows if not r["allclose"]]
    if failed:
        raise RetrievalError(f"model '{model}': the graph differs from the PyTorch reference beyond "
                             f"{tolerance} in {len(failed)} of {len(rows)} comparisons; nothing was "
                             "written:\n" + parity_markdown(rows))
    return rows


def export_graph(source_json: str | os.PathLike, heads_dir: str | os.PathLike | None,
                 out_dir: str | os.PathLike, settings: Settings) -> tuple[dict, list[dict], Memory]:
    """Export, optimise and check the three-head graph; publish `out_dir`; return (manifest, parity rows,
    the memory of each phase).

    `heads_dir` holds colbert_linear.pt and sparse_linear.pt; None reads them from the model's directory
    (where the Hub snapshot of BGE-M3 keeps them, hashed in source.json). Nothing reaches `out_dir`
    unless every case passes.
    """
    _check_settings(settings)
    threads = machine.torch_threads(settings.threads)
    memory = Memory()
    model_dir, source = source_dir(source_json)
    with memory.phase("load the PyTorch model; the reference of every case"):
        encoder = load_pytorch(model_dir)
        config = encoder.config
        heads = load_heads(heads_dir if heads_dir is not None else model_dir, int(config.hidden_size))
        ignored = ignored_ids(model_dir, config)
        ids = list(ignored.values())
        cases = parity_cases(model_dir / "tokenizer.json", config)
        # All the references first (at most tens of MiB: the longest case's ColBERT vectors), so that the
        # PyTorch model is gone before ONNX Runtime loads the graph.
        wants = [reference(encoder, heads, ids, c.input_ids, c.attention_mask) for c in cases]
    width, dim, vocab = int(config.hidden_size), int(heads.colbert.out_features), int(config.vocab_size)
    shapes = {"dense": ["batch", width], "sparse": ["batch", vocab], "colbert": ["batch", "sequence", dim]}
    with files.staging_dir(out_dir) as stage:
        raw, publish = stage / "raw" / ONNX_FILE, stage / "model"
        raw.parent.mkdir()
        publish.mkdir()
        with memory.phase("export to ONNX (TorchScript tracer)"):
            _trace(encoder, heads, ids, next(c for c in cases if c.name == "batch"), raw, settings.opset)
            del encoder  # the heads stay (small; their shapes go into the manifest)
            gc.collect()
        with memory.phase("optimise, check and save the graph"):
            external = _optimise(raw, publish / ONNX_FILE, shapes, settings, threads)
        memory.model_bytes = sum(p.stat().st_size for p in files.list_files(publish))
        with memory.phase("check the graph in ONNX Runtime, case by case"):
            rows = _check_cases(publish / ONNX_FILE, cases, wants, settings.tolerance, threads,
                                source["model"])
        shutil.copyfile(model_dir / "tokenizer.json", publish / TOKENIZER_FILE)
        shutil.copyfile(model_dir / "config.json", publish / CONFIG_FILE)
        record = _record(source, heads, heads_dir, ignored, shapes, settings, external, cases, rows)
        record["files"] = [files.file_record(p, publish) for p in files.list_files(publish)]
        files.write_json(publish / MANIFEST, record)
        files.replace_dir(publish, out_dir)
    return record, rows, memory


def _record(source: dict, heads: Heads, heads_dir: str | os.PathLike | None, ignored: dict[str, int],
            shapes: dict[str, list], settings: Settings, external: bool, cases: list[Case], rows: list[dict]
            ) -> dict:
    """retrieval.json, less its file list."""
    return {
        "model": source["model"],
        "source": source["source"],
        "source_tree_sha256": source["tree_sha256"],
        "libraries": provenance.library_versions(
            ["torch", "transformers", "tokenizers", "onnx", "onnxruntime"]),
        "heads": {
            "from": "model directory" if heads_dir is None else "heads directory",
            **{name: {**files.file_record(path), "shape": list(getattr(heads, name).weight.shape)}
               for name, path in heads.files.items()},
        },
        "exporter": checked_export.exporter_record(
            settings.opset, shapes,
            attention=f"{PER_HEAD_ATTENTION}: transformers' eager attention, one head at a time"),
        "heads_semantics": {
            "dense": "hidden[:, 0], L2-normalised",
            "sparse": "relu(sparse_linear(hidden)) * mask, max over tokens per vocabulary id "
                      "(ScatterElements reduction max), ignored ids zeroed",
            "sparse_ignored_ids": ignored,
            "colbert": "colbert_linear(hidden), L2-normalised, * mask; first position kept",
        },
        "optimization": {"offline": settings.ort_optimization, "external_data": external,
                         "check_session": CHECK_OPTIMIZATION},
        "check": {
            "cases": [{"name": c.name, "purpose": c.purpose, "rows": int(c.input_ids.shape[0]),
                       "tokens": int(c.attention_mask.sum())} for c in cases],
            "tolerance": settings.tolerance,
            "reference_attention": REFERENCE_ATTENTION,
            "criterion": "numpy.allclose(graph, reference, rtol=0, atol=tolerance) on every element",
            "max_abs": {o: max(r["max_abs"] for r in rows if r["output"] == o) for o in OUTPUTS},
        },
    }


# --- verification ---------------------------------------------------------------------------------

def verify(directory: str | os.PathLike, manifest_name: str) -> list[str]:
    """One line per missing or changed file the manifest lists (empty: all match). Runs nothing."""
    directory = Path(directory)
    path = directory / manifest_name
    try:
        entries = files.read_json(path, MANIFEST_WHAT, "export the graph again", kind=dict)["files"]
    except files.JsonError as err:
        return [str(err)]
    except KeyError:
        return [f"{path}: expected {MANIFEST_WHAT}, found no 'files'"]
    problems = []
    for entry in entries:
        target = directory / entry["path"]
        if not target.is_file():
            problems.append(f"{target} is missing (expected {entry['bytes']} bytes, "
                            f"sha256 {entry['sha256']})")
            continue
        actual, size = files.sha256_file(target), target.stat().st_size
        if actual != entry["sha256"]:
            problems.append(f"{target} changed: expected {entry['bytes']} bytes, sha256 {entry['sha256']}; "
                            f"found {size} bytes, sha256 {actual}")
    return problems
