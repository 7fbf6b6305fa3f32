"""A fine-tuned pipeline as one graph: the encoder's written graph with the word pooling, the linear head
and the tags appended, run from piece ids to tags by one ONNX Runtime session.

    fields = head(width=384, tags=17, pooling="mean")            # what onnx.patch.patch appends
    tagger = GraphTagger("results/models/minilm", "results/writeback/R/pipeline.encoder0.onnx",
                         pooling="mean", max_length=512, batch_size=8, threads=2)
    tags = tagger.predict(docs)                                   # as Tagger.predict
    logits = tagger.logits(docs)                                  # float32 [words, 17] per document

The graph (`head` gives the fields appended to the export's, `onnx.patch.Appendix(**fields)`;
names.HEAD_WEIGHT and names.HEAD_BIAS are written among the replacements, as the encoder's weights
are; `writeback.head_appendix` does both):

    inputs   input_ids, attention_mask   int64 [batch, sequence]            the export's
             word_pieces                 int64 [words, pieces_per_word]     see below
    outputs  last_hidden_state           float32 [batch, sequence, width]   the export's, kept
             logits                      float32 [words, tags]
             tags                        int64 [words]

`word_pieces` row w lists word w's pieces, in piece order, as rows of last_hidden_state flattened to
[batch x sequence, width] (window b's position s is row b x sequence + s), then -1 up to the table's
width. The pooling is the run's, fixed in the graph: `mean` sums (1 / count) x each listed piece's
vector in that order, `first` takes the first listed piece's vector, and a word without pieces gets
zeros, as `tokens.WordPieces.pool` and `trainable.words` compute. Then logits = words @ weight + bias
(weight stored [width, tags], as the exporter stores every MatMul weight) and tags = their argmax
(the first of equal logits, as torch.argmax). The map being an input, the caller says which window
each piece is read from: the one `tokens.JoinedPieces.window` names, as both encoders read it.

Every op is in the default domain with the signature it has had since opset 13 (ReduceSum and
Unsqueeze take their axes as an input); `patch` refuses an older graph.

`GraphTagger` cuts documents as both encoders do (`tokens.PieceTokenizer.prepare_joined`, in flat arrays
over all documents: cutting them into per-document objects cost more than the feeds), groups them
as `Tagger.predict` does (`word_batches`), and runs each group's documents, longest first, in
batches of at most `batch_size` windows (a document's windows share a batch, since its words may read
pieces from each), every batch's inputs made before the first run, so the runs go back to back: no
PyTorch and no pooling between them. With `encoder.batch_pieces` set, a batch is instead as many
documents as fit that many padded pieces (`piece_batches`: what the trainable encoder's
`max_batch_pieces` does), the grouping the writeback speed table times both paths on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...core import machine
from ...core.errors import UserError
from ...data.conllu import UPOS
from ...data.tasks import DEFAULT as DEFAULT_TASK
from ...data.tasks import check_tags
from ...encoders.families import usable_positions
from ...encoders.frozen import EncoderError, open_export
from ...encoders.tokens import Doc, JoinedPieces, PieceTokenizer, WordPieces, check_pooling
from ...onnx import manifest, names, runtime
from ...onnx.runtime import INPUTS, OUTPUT
from .tagger import EVAL_BATCH_WORDS, word_batches

WORD_PIECES = "word_pieces"  # int64 [words, pieces_per_word]
LOGITS = "logits"  # float32 [words, tags]
TAGS = "tags"  # int64 [words]
NO_PIECE = -1  # fills a row of word_pieces past the word's pieces
MIN_OPSET = 13
SCOPE = "/tagger/"  # node and value names; the exporter's are /model/... and onnx::...


def head(width: int, tags: int, pooling: str) -> dict:
    """The head's nodes, inputs, outputs and initializer declarations for a graph of this width: the
    fields of an `onnx.patch.Appendix` (not made here, so that taggers do not depend on the patcher)."""
    import onnx
    from onnx import TensorProto, helper

    check_pooling(pooling)
    nodes = _Nodes()
    flat = nodes.add("Reshape", [OUTPUT, nodes.constant("flat_shape", np.array([-1, width], np.int64))],
                     "flat")  # [batch x sequence, width]
    zero = nodes.constant("zero", np.array(0, np.int64))
    words = _mean(nodes, flat, zero) if pooling == "mean" else _first(nodes, flat, zero)
    product = nodes.add("MatMul", [words, names.HEAD_WEIGHT], "product")
    logits = nodes.add("Add", [product, names.HEAD_BIAS], LOGITS, scoped=False)
    nodes.add("ArgMax", [logits], TAGS, scoped=False, axis=1, keepdims=0)

    declared = []
    for name, dims in ((names.HEAD_WEIGHT, [width, tags]), (names.HEAD_BIAS, [tags])):
        tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT)
        tensor.dims.extend(dims)
        declared.append(tensor)
    value = helper.make_tensor_value_info
    return {"nodes": tuple(nodes.made),
            "inputs": (value(WORD_PIECES, TensorProto.INT64, ["words", "pieces_per_word"]),),
            "outputs": (value(LOGITS, TensorProto.FLOAT, ["words", tags]),
                        value(TAGS, TensorProto.INT64, ["words"])),
            "initializers": tuple(declared), "min_opset": MIN_OPSET}


def _mean(nodes: _Nodes, flat: str, zero: str) -> str:
    """[words, width]: the sum over each row of word_pieces of (1 / count) x the piece's vector."""
    from onnx import TensorProto

    listed = nodes.add("GreaterOrEqual", [WORD_PIECES, zero], "listed")  # bool [words, pieces]
    rows = nodes.add("Gather", [flat, nodes.add("Max", [WORD_PIECES, zero], "rows")], "pieces", axis=0)
    ones = nodes.add("Cast", [listed], "ones", to=TensorProto.FLOAT)
    axis1 = nodes.constant("axis1", np.array([1], np.int64))
    count = nodes.add("ReduceSum", [ones, axis1], "count", keepdims=1)  # [words, 1]
    at_least_one = nodes.add("Max", [count, nodes.constant("one", np.array(1.0, np.float32))], "divisor")
    weight = nodes.add("Div", [ones, at_least_one], "weight")  # 1 / count, or 0 past the pieces
    weight = nodes.add("Unsqueeze", [weight, nodes.constant("axis2", np.array([2], np.int64))], "weight3")
    terms = nodes.add("Mul", [rows, weight], "terms")  # [words, pieces, width]
    return nodes.add("ReduceSum", [terms, axis1], "words", keepdims=0)


def _first(nodes: _Nodes, flat: str, zero: str) -> str:
    """[words, width]: the vector of each word's first piece (zeros without one)."""
    from onnx import TensorProto

    first = nodes.add("Gather", [WORD_PIECES, zero], "first", axis=1)  # [words]
    rows = nodes.add("Gather", [flat, nodes.add("Max", [first, zero], "rows")], "pieces", axis=0)
    listed = nodes.add("Cast", [nodes.add("GreaterOrEqual", [first, zero], "listed")], "ones",
                       to=TensorProto.FLOAT)
    ones = nodes.add("Unsqueeze", [listed, nodes.constant("axis1", np.array([1], np.int64))], "ones2")
    return nodes.add("Mul", [rows, ones], "words")


class _Nodes:
    """Nodes made in order, each named SCOPE + its output's name (outputs too, unless `scoped` is False)."""

    def __init__(self):
        self.made = []

    def add(self, op: str, inputs: list[str], output: str, scoped: bool = True, **attributes) -> str:
        from onnx import helper

        name = SCOPE + output if scoped else output
        self.made.append(helper.make_node(op, inputs, [name], name=f"{SCOPE}{output}/{op}", **attributes))
        return name

    def constant(self, output: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        return self.add("Constant", [], output, value=numpy_helper.from_array(value))


# -- running it -----------------------------------------------------------------------------------------

def piece_batches(longest: Sequence[int], windows: Sequence[int], max_pieces: int) -> list[list[int]]:
    """Document indices in runs of at most `max_pieces` padded pieces, for documents of `windows[d]`
    windows whose longest has `longest[d]` ids: longest first (ties in order), a run taking documents
    while its windows x its longest window (the first document's) stay within the budget; a document's
    windows share a run, and one over the budget runs alone. The grouping
    `trainable.words.plan_batches` makes of one-window documents."""
    if isinstance(max_pieces, bool) or not isinstance(max_pieces, int) or max_pieces < 1:
        raise ValueError(f"max_pieces must be a positive integer, got {max_pieces!r}")
    runs: list[list[int]] = []
    count = 0
    for d in sorted(range(len(longest)), key=lambda d: -longest[d]):
        if runs and (count + windows[d]) * longest[runs[-1][0]] <= max_pieces:
            runs[-1].append(d)
            count += windows[d]
        else:
            runs.append([d])
            count = windows[d]
    return runs


def piece_table(words: WordPieces, rows: np.ndarray) -> np.ndarray:
    """The `word_pieces` input: int64 [words, most pieces of a word (at least 1)], row w holding
    rows[p] for word w's pieces p in order, then NO_PIECE."""
    counts = words.counts()
    table = np.full((words.n_words, max(1, int(counts.max(initial=0)))), NO_PIECE, np.int64)
    if len(words.word):
        # Pairs are sorted by word, then piece: a word's pairs are one run; j counts along it.
        starts = np.flatnonzero(np.diff(words.word, prepend=-1))
        j = np.arange(len(words.word)) - np.repeat(starts, np.diff(starts, append=len(words.word)))
        table[words.word, j] = rows[words.piece]
    return table


class PieceFeeds:
    """How documents become the graph's inputs: the export's tokenizer and windows, and the map.

    `max_length` counts the special tokens and is capped at the model's positions, as both encoders
    cap it; `batch_size` is windows per run, unless `batch_pieces` is set: then a run holds at most
    that many padded pieces (`piece_batches`). The export directory is verified as the encoders verify it.
    """

    def __init__(self, model_dir: str | os.PathLike, pooling: str, max_length: int, batch_size: int,
                 batch_pieces: int | None = None):
        check_pooling(pooling)
        for name, value in (("max_length", max_length), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.model_dir = Path(model_dir)
        self.manifest, self.config = open_export(self.model_dir)
        self.pooling, self.batch_size, self.batch_pieces = pooling, batch_size, batch_pieces
        self.max_length_requested = max_length
        positions = usable_positions(self.config)
        self.max_length = min(max_length, positions) if positions else max_length
        self.tokenizer = PieceTokenizer(self.model_dir / manifest.TOKENIZER_FILE)
        self.tokenizer.window_size(self.max_length)  # fail now, not on the first long document
        pad = self.config.get("pad_token_id")  # padding is masked: the model's own pad id, by convention
        self.pad_id = int(pad) if pad is not None else 0
        self.width = int(self.config["hidden_size"])

    def batches(self, joined: JoinedPieces) -> list[tuple[list[int], dict[str, np.ndarray]]]:
        """(document indices, the graph's inputs) of each run over `joined`'s documents: longest window
        first (ties in order), at most `batch_size` windows a run unless one document has more (or at
        most `batch_pieces` padded pieces, when set)."""
        longest, windows = window_counts(joined)
        if self.batch_pieces is not None:
            groups = piece_batches(longest, windows, self.batch_pieces)
        else:
            groups = []
            count = 0
            for d in sorted(range(len(longest)), key=lambda d: -longest[d]):
                if not groups or count + windows[d] > self.batch_size:
                    groups.append([])
                    count = 0
                groups[-1].append(d)
                count += windows[d]
        return [(group, self.feeds(joined, group)) for group in groups]

    def feeds(self, joined: JoinedPieces, group: Sequence[int]) -> dict[str, np.ndarray]:
        """The inputs of one run over these documents' windows, in this order (one window of specials
        alone when they have none: their words read no piece)."""
        docs = np.asarray(group, dtype=np.int64)
        first = joined.first_window
        mine = _ranges(first[docs], first[docs + 1])  # the run's windows, in run order
        windows = [joined.inputs[j] for j in mine.tolist()] or [self.tokenizer.wrap(np.zeros(0, np.int64))]
        input_ids, mask = runtime.pad_batch(windows, self.pad_id)
        # The documents' windows, pieces and words renumbered from the run's first (each document's are
        # one run of the joined arrays): piece p is read from row (its window's place in the run) x
        # length + row[p] of the flattened output.
        starts, words = joined.piece_start, joined.words
        n_windows, n_pieces = first[docs + 1] - first[docs], starts[docs + 1] - starts[docs]
        pieces = _ranges(starts[docs], starts[docs + 1])
        window = joined.window[pieces] + np.repeat(_shift(n_windows, first[docs]), n_pieces)
        rows = window * input_ids.shape[1] + joined.row[pieces]
        pair_start, word_start = joined.pair_start, joined.word_start
        n_pairs = pair_start[docs + 1] - pair_start[docs]
        pairs = _ranges(pair_start[docs], pair_start[docs + 1])
        n_words = word_start[docs + 1] - word_start[docs]
        run_words = WordPieces(int(n_words.sum()),
                               words.word[pairs] + np.repeat(_shift(n_words, word_start[docs]), n_pairs),
                               words.piece[pairs] + np.repeat(_shift(n_pieces, starts[docs]), n_pairs))
        return {"input_ids": input_ids, "attention_mask": mask, WORD_PIECES: piece_table(run_words, rows)}


def window_counts(joined: JoinedPieces) -> tuple[list[int], list[int]]:
    """Each document's longest window (ids, specials included; 0 without windows) and its windows."""
    sizes = np.fromiter(map(len, joined.inputs), np.int64, len(joined.inputs))
    first = joined.first_window
    windows = np.diff(first)
    longest = np.zeros(len(windows), dtype=np.int64)
    some = windows > 0
    if some.any():
        longest[some] = np.maximum.reduceat(sizes, first[:-1][some])
    return longest.tolist(), windows.tolist()


def _shift(counts: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """What to add to item firsts[i] + k of a joined array to number it in runs of `counts` laid one
    after another: counts before i, less firsts[i]."""
    return np.cumsum(counts) - counts - firsts


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The integers of [starts[i], ends[i]) for each i in turn, in one array."""
    counts = ends - starts
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(_shift(counts, starts), counts)


class GraphTagger:
    """A written pipeline graph's tagger: one ONNX Runtime session from piece ids to tags.

    What `tagging.pipeline.load` gives for a file whose whole tagger is a graph (see the module
    docstring). `encoder` is the input side (`PieceFeeds`: tokenizer, windows, the map); there are no
    modules. `threads` is ONNX Runtime's intra-op threads, capped at the machine's cores.
    """

    kind = "transformer"
    trainable_encoder = False

    def __init__(self, model_dir: str | os.PathLike, graph: str | os.PathLike, pooling: str = "mean",
                 max_length: int = 512, batch_size: int = 8, threads: int = 1, optimization: str = "all",
                 tags: Sequence[str] = UPOS, task: str = DEFAULT_TASK):
        check_tags(task, tags)
        self.task = task
        self.encoder = PieceFeeds(model_dir, pooling, max_length, batch_size)
        self.tags = tuple(tags)
        self.graph = Path(graph)
        self.threads_requested, self.threads = threads, machine.usable_threads(threads)
        self.optimization = optimization
        try:
            self.session = runtime.ort_session(self.graph, self.threads, optimization)
        except UserError:
            raise
        except Exception as err:  # ONNX Runtime's errors do not always say which file
            raise EncoderError(f"{self.graph}: ONNX Runtime cannot load the pipeline graph: {err}") from err
        inputs = sorted(i.name for i in self.session.get_inputs())
        outputs = sorted(o.name for o in self.session.get_outputs())
        if inputs != sorted([*INPUTS, WORD_PIECES]) or outputs != sorted([OUTPUT, LOGITS, TAGS]):
            raise EncoderError(f"{self.graph}: inputs {inputs} and outputs {outputs}; a pipeline graph has "
                               f"inputs {[*INPUTS, WORD_PIECES]} and outputs {[OUTPUT, LOGITS, TAGS]} "
                               "(see encoder_study.recipes.tagging.graph)")

    def encoder_files(self) -> dict[str, str]:
        """SHA-256 of the export's model files (checked against export.json on load)."""
        listed = {e["path"]: e["sha256"] for e in self.encoder.manifest.get("files", [])}
        return {name: listed[name] for name in manifest.MODEL_FILES}

    def predict_ids(self, docs: Sequence[Doc], batch_words: int = EVAL_BATCH_WORDS) -> list[np.ndarray]:
        """The tag index per word, one int64 array per document; groups as `Tagger.predict_ids`."""
        return self._grouped(docs, batch_words, TAGS)

    def predict(self, docs: Sequence[Doc], batch_words: int = EVAL_BATCH_WORDS) -> list[list[str]]:
        """UPOS tags, one list per document."""
        return [[self.tags[i] for i in ids] for ids in self.predict_ids(docs, batch_words)]

    def logits(self, docs: Sequence[Doc], batch_words: int = EVAL_BATCH_WORDS) -> list[np.ndarray]:
        """float32 [words, tags] per document."""
        return self._grouped(docs, batch_words, LOGITS)

    def hidden_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The encoder's last_hidden_state for these windows, from the same session (no words asked)."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask,
                 WORD_PIECES: np.zeros((0, 1), np.int64)}
        return self.session.run([OUTPUT], feeds)[0]

    def _grouped(self, docs: Sequence[Doc], batch_words: int, output: str) -> list[np.ndarray]:
        for doc in docs:
            if not isinstance(doc, Doc):
                raise TypeError(f"GraphTagger takes encoders.tokens.Doc, got {type(doc).__name__}")
        out: list[np.ndarray] = []
        for group in word_batches([len(doc.words) for doc in docs], range(len(docs)), batch_words):
            out += self._run([docs[i] for i in group], output)
        return out

    def _run(self, docs: list[Doc], output: str) -> list[np.ndarray]:
        """`output` of each document: every run's inputs made first, then the runs back to back."""
        feeds = self.encoder
        joined = feeds.tokenizer.prepare_joined(docs, feeds.max_length)
        batches = feeds.batches(joined)
        results = [self.session.run([output], inputs)[0] for _, inputs in batches]
        n_words = np.diff(joined.word_start).tolist()
        out: list[np.ndarray] = [np.zeros(0)] * len(docs)
        for (group, _), result in zip(batches, results, strict=True):
            end = 0
            for d in group:  # slices, not np.split: a view each either way, at a fraction of the cost
                start, end = end, end + n_words[d]
                out[d] = result[start:end]
        return out
