"""Fine-tuned weights written back into a copy of the ONNX graph they were read from.

`patch(src, dst, {name: array})` streams the source file's protobuf fields (onnx.proto3: ModelProto
.graph = 7, GraphProto .node = 1 and .initializer = 5, TensorProto dims = 1, data_type = 2, name = 8,
raw_data = 9) and writes a copy in which only the named float32 initializers' values differ. Every
other field is copied as the byte range it was, so writing back unchanged values gives the source's
bytes. With `appended` (an `Appendix`: nodes, graph inputs and outputs, and float32 initializers
declared by name and shape whose values come with the replacements), those fields are added, each
after the source's last field of its kind, and nothing else changes: the tagging head a written
pipeline graph carries (`tagging.graph`) is appended so. `StreamedGraph(path)` reads the same index
without writing: the graph's `names.Layout` (what names the weights, see `onnx.names`) and single
initializers' values, so that a graph larger than memory can be named
(encoder_study.recipes.writeback.module_weights_to_graph gives the replacements for a trainable encoder).

The reader trusts nothing: every length is checked against the bytes left in its parent before it is
read, names are at most 4 KiB, a node larger than 64 KiB is copied without being parsed, and a message
has at most 4 million fields. Anything it cannot write faithfully (external data, non-float32
weights, a result over 2 GiB, a malformed file) raises `WritebackError` before the output exists; the
output is written under a temporary name and renamed, so a failure leaves nothing behind.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core import files
from ..core.errors import UserError
from . import names

log = logging.getLogger(__name__)

MAX_NAME = 4096  # bytes in a tensor, node or value name
MAX_NODE = 64 * 1024  # larger nodes (Constant tables, subgraphs) are copied, never parsed
MAX_FIELDS = 4_000_000  # per message
MAX_OUTPUT = 2**31 - 1  # protobuf's limit on one message: ONNX cannot load a larger single file
CHUNK = 1 << 20
BLOCK = 64 * 1024  # the reader's cached block; larger reads bypass it

FLOAT = names.FLOAT  # TensorProto.DataType.FLOAT
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5

# TensorProto data fields other than raw_data (9) and float_data (4); a float32 tensor has none.
OTHER_DATA = {5: "int32_data", 6: "string_data", 7: "int64_data", 10: "double_data", 11: "uint64_data"}
FIX = ("write the graph again in one piece (onnx.save(onnx.load(path), path, save_as_external_data=False)) "
       "or export it again with encoder_study.recipes.export.export")


class WritebackError(UserError, ValueError):
    """The graph cannot be patched as asked; the message names the file and what to do."""


# -- reading --------------------------------------------------------------------------------------

class _Source:
    """Reads small pieces of a file at offsets through one cached block, so the file is never held."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = open(path, "rb")
        self.size = os.fstat(self.handle.fileno()).st_size
        self.block, self.block_start = b"", 0

    def read(self, offset: int, n: int) -> bytes:
        """`n` bytes at `offset`; callers have checked that they lie inside the file."""
        end = offset + n
        if n > BLOCK:  # a tensor's data: read for the caller alone, so the block never holds it after
            self.handle.seek(offset)
            data = self.handle.read(n)
            if len(data) < n:
                raise self.malformed(f"the file ends at byte {self.size}, inside a field at {offset}")
            return data
        if not (self.block_start <= offset and end <= self.block_start + len(self.block)):
            self.handle.seek(offset)
            self.block, self.block_start = self.handle.read(BLOCK), offset
            if len(self.block) < n:
                raise self.malformed(f"the file ends at byte {self.size}, inside a field at {offset}")
        return self.block[offset - self.block_start:end - self.block_start]

    def copy(self, start: int, end: int, out) -> None:
        """Copy bytes [start, end) to `out` in chunks."""
        self.handle.seek(start)
        while start < end:
            chunk = self.handle.read(min(CHUNK, end - start))
            if not chunk:
                raise self.malformed(f"the file ended while copying bytes {start}..{end}")
            out.write(chunk)
            start += len(chunk)

    def malformed(self, why: str) -> WritebackError:
        return WritebackError(f"{self.path}: not a well-formed ONNX file ({why}); it may be truncated or "
                              "damaged: copy or export it again")

    def close(self) -> None:
        self.handle.close()


def _varint(data: bytes, pos: int, source: _Source, where: int) -> tuple[int, int]:
    """(value, next position) of the varint at data[pos:]; at most 10 bytes, all inside `data`."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise source.malformed(f"a varint at byte {where + pos} runs past its message or past 10 bytes")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass
class _Field:
    number: int
    wire: int
    start: int  # of the key
    value_start: int  # of the payload (after the length for LENGTH)
    end: int
    value: int = 0  # VARINT fields


def _fields(source: _Source, start: int, end: int, data: bytes | None = None):
    """Yield the fields of the message in bytes [start, end) of the file (or of `data`, which holds them)."""
    pos, count = start, 0
    while pos < end:
        count += 1
        if count > MAX_FIELDS:
            raise source.malformed(f"more than {MAX_FIELDS} fields in the message at byte {start}")
        if data is not None:
            head = data[pos - start:pos - start + 20]
        else:
            head = source.read(pos, min(20, end - pos))
        key, i = _varint(head, 0, source, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise source.malformed(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, j = _varint(head, i, source, pos)
            yield _Field(number, wire, pos, pos + i, pos + j, value)
            pos += j
            continue
        if wire == LENGTH:
            length, j = _varint(head, i, source, pos)
            size, payload = j + length, pos + j
        elif wire in (FIXED64, FIXED32):
            size, payload = i + (8 if wire == FIXED64 else 4), pos + i
        else:  # groups (3, 4) are not used by ONNX; 6 and 7 do not exist
            raise source.malformed(f"wire type {wire} at byte {pos}")
        if size > end - pos:
            raise source.malformed(f"field {number} at byte {pos} needs {size} bytes, "
                                   f"{end - pos} are left in its message")
        yield _Field(number, wire, pos, payload, pos + size)
        pos += size


def _expect(source: _Source, f: _Field, wire: int, what: str) -> None:
    if f.wire != wire:
        raise source.malformed(f"{what} at byte {f.start} has wire type {f.wire}, expected {wire}")


def _text(source: _Source, f: _Field, what: str, data: bytes | None = None, base: int = 0) -> str:
    _expect(source, f, LENGTH, what)
    if f.end - f.value_start > MAX_NAME:
        raise source.malformed(f"a {what} at byte {f.start} is {f.end - f.value_start} bytes, "
                               f"more than {MAX_NAME}")
    raw = data[f.value_start - base:f.end - base] if data is not None else source.read(f.value_start,
                                                                                       f.end - f.value_start)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise source.malformed(f"a {what} at byte {f.start} is not UTF-8") from err


@dataclass
class _Tensor:
    """An initializer as indexed: where its field lies and what the patcher needs to know of it."""

    span: _Field
    name: str = ""
    data_type: int = 0
    dims: list[int] = field(default_factory=list)
    external: bool = False
    parts: list[_Field] = field(default_factory=list)  # the tensor's own fields, in order

    @property
    def count(self) -> int:
        return math.prod(self.dims)  # Python ints: hostile dims cannot overflow


def _tensor(source: _Source, outer: _Field) -> _Tensor:
    t = _Tensor(outer)
    for f in _fields(source, outer.value_start, outer.end):
        t.parts.append(f)
        if f.number == 1:  # dims: unpacked varints or one packed run
            if f.wire == VARINT:
                t.dims.append(f.value)
            else:
                _expect(source, f, LENGTH, "tensor dims")
                if f.end - f.value_start > MAX_NAME:
                    raise source.malformed(f"tensor dims at byte {f.start} exceed {MAX_NAME} bytes")
                run = source.read(f.value_start, f.end - f.value_start)
                pos = 0
                while pos < len(run):
                    value, pos = _varint(run, pos, source, f.value_start)
                    t.dims.append(value)
        elif f.number == 2:
            _expect(source, f, VARINT, "tensor data_type")
            t.data_type = f.value
        elif f.number == 8:
            t.name = _text(source, f, "tensor name")
        elif f.number == 13:  # external_data entries
            t.external = True
        elif f.number == 14:
            _expect(source, f, VARINT, "tensor data_location")
            t.external = t.external or f.value == EXTERNAL
    if any(d >= 2**63 for d in t.dims):
        raise source.malformed(f"tensor {t.name!r} has a negative dimension")
    return t


@dataclass
class _Node:
    span: _Field
    op_type: str = ""
    name: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def _node(source: _Source, outer: _Field) -> _Node:
    data = source.read(outer.value_start, outer.end - outer.value_start)
    node = _Node(outer)
    for f in _fields(source, outer.value_start, outer.end, data):
        if f.number == 1:
            node.inputs.append(_text(source, f, "node input", data, outer.value_start))
        elif f.number == 2:
            node.outputs.append(_text(source, f, "node output", data, outer.value_start))
        elif f.number == 3:
            node.name = _text(source, f, "node name", data, outer.value_start)
        elif f.number == 4:
            node.op_type = _text(source, f, "node op_type", data, outer.value_start)
    return node


@dataclass
class _Index:
    model_fields: list[_Field]
    graph: _Field
    graph_fields: list[_Field]
    tensors: dict[str, _Tensor]  # by name
    identity: dict[str, _Node]  # output name -> Identity node
    matmul: list[_Node] = field(default_factory=list)  # MatMul nodes, which name the linear weights
    scoped: bool = False  # some node name carries a module scope (/model/...), as TorchScript writes
    defined: set[str] = field(default_factory=set)  # graph inputs and the outputs of the nodes parsed
    outputs: list[str] = field(default_factory=list)  # the graph's outputs


def _index(source: _Source) -> _Index:
    model_fields = list(_fields(source, 0, source.size))
    graphs = [f for f in model_fields if f.number == 7]
    if len(graphs) != 1:
        raise source.malformed(f"{len(graphs)} graph fields (ModelProto.graph), expected one")
    _expect(source, graphs[0], LENGTH, "the graph")
    if not any(f.number == 8 for f in model_fields):
        raise source.malformed("no opset_import; the file probably ends early")
    graph = graphs[0]
    graph_fields = list(_fields(source, graph.value_start, graph.end))
    index = _Index(model_fields, graph, graph_fields, {}, {})
    for f in graph_fields:
        if f.number == 5:
            _expect(source, f, LENGTH, "an initializer")
            t = _tensor(source, f)
            if t.name in index.tensors:
                raise source.malformed(f"two initializers are named {t.name!r}")
            index.tensors[t.name] = t
        elif f.number == 1:
            _expect(source, f, LENGTH, "a node")
            if f.end - f.value_start <= MAX_NODE:
                node = _node(source, f)
                if node.op_type == "Identity" and len(node.inputs) == 1 and len(node.outputs) == 1:
                    index.identity[node.outputs[0]] = node
                elif node.op_type == "MatMul":
                    index.matmul.append(node)
                index.scoped = index.scoped or node.name.startswith("/")
                index.defined.update(node.outputs)
        elif f.number in (11, 12):  # ValueInfoProto: name = 1
            _expect(source, f, LENGTH, "a graph input or output")
            name = next((_text(source, g, "value name") for g in _fields(source, f.value_start, f.end)
                         if g.number == 1), "")
            (index.defined.add if f.number == 11 else index.outputs.append)(name)
    return index


def _opset(source: _Source, index: _Index) -> int | None:
    """The graph's default-domain opset (ModelProto.opset_import = 8: domain = 1, version = 2)."""
    for f in index.model_fields:
        if f.number != 8:
            continue
        _expect(source, f, LENGTH, "an opset_import")
        domain, version = "", None
        for g in _fields(source, f.value_start, f.end):
            if g.number == 1:
                domain = _text(source, g, "opset domain")
            elif g.number == 2 and g.wire == VARINT:
                version = g.value
        if domain in ("", "ai.onnx"):
            return version
    return None


def _refuse_external(source: _Source, index: _Index) -> None:
    external = [t.name for t in index.tensors.values() if t.external]
    if external:
        raise WritebackError(f"{source.path}: {len(external)} initializers (e.g. {external[0]!r}) live in "
                             f"external data files, which a copy of the graph file would not carry; {FIX}")


def _names_layout(source: _Source, index: _Index) -> names.Layout:
    """The index as the naming rules see a graph (`onnx.names`)."""
    producer = next((_text(source, f, "producer name") for f in index.model_fields if f.number == 2), "")
    read = sorted([*index.identity.values(), *index.matmul], key=lambda n: n.span.start)  # graph order
    nodes = [names.Node(n.op_type, n.name, n.inputs, n.outputs) for n in read]
    return names.Layout(source.path, producer, {name: t.data_type for name, t in index.tensors.items()},
                        nodes, index.scoped)


def _data_spans(source: _Source, t: _Tensor) -> list[tuple[int, int]]:
    """The byte ranges that hold `t`'s float32 values, in order, checked against its dims."""
    spans = []
    for f in t.parts:  # raw_data is bytes; float_data is packed (bytes) or one fixed32 per entry
        if f.number not in (4, 9):
            continue
        if f.wire not in ((LENGTH,) if f.number == 9 else (LENGTH, FIXED32)):
            raise source.malformed(f"tensor {t.name!r}: data field {f.number} at byte {f.start} has wire "
                                   f"type {f.wire}")
        spans.append((f.value_start, f.end if f.wire == LENGTH else f.value_start + 4))
    stored = sum(end - start for start, end in spans)
    if stored != 4 * t.count:
        raise source.malformed(f"tensor {t.name!r} has {stored} bytes of data for dims {t.dims}")
    return spans


def _old_value(source: _Source, t: _Tensor) -> np.ndarray:
    """The stored float32 values of `t` (raw_data or float_data), checked against its dims."""
    raw = b"".join(source.read(start, end - start) for start, end in _data_spans(source, t))
    try:
        return np.frombuffer(raw, dtype="<f4").reshape(t.dims)
    except ValueError as err:  # an empty tensor with a dimension numpy cannot hold ([2**62, 0])
        raise source.malformed(f"tensor {t.name!r} has dims {t.dims} ({err})") from err


def _chunks(value: np.ndarray):
    """`value`'s bytes in C order, about CHUNK at a time. A contiguous array gives views of its own
    memory; any other (a module's weight transposed to [in, out] is a view) a block of leading rows
    copied at a time, so that no replacement is ever copied whole."""
    if value.flags.c_contiguous:
        flat = memoryview(value.reshape(-1)).cast("B")
        for at in range(0, len(flat), CHUNK):
            yield flat[at:at + CHUNK]
        return
    rows = max(1, CHUNK // max(1, value[0].nbytes))
    for i in range(0, value.shape[0], rows):
        yield memoryview(np.ascontiguousarray(value[i:i + rows]).reshape(-1)).cast("B")


def _stored_equals(source: _Source, t: _Tensor, value: np.ndarray) -> bool:
    """Whether `value` (float32, any strides) is bitwise what `t` stores; both read a chunk at a time,
    so that comparing a replacement costs no second copy of it."""
    spans = _data_spans(source, t)
    if list(value.shape) != t.dims:
        return False
    span, pos = 0, spans[0][0] if spans else 0
    for mine in _chunks(value):
        stored, n = [], len(mine)
        while n:  # the same byte count from the data fields, in order (float_data may be many fields)
            take = min(n, spans[span][1] - pos)
            if take <= 0:  # cannot happen (_data_spans checked the count); never loop on it
                return False
            stored.append(source.read(pos, take))
            pos, n = pos + take, n - take
            if pos == spans[span][1] and span + 1 < len(spans):
                span += 1
                pos = spans[span][0]
        if b"".join(stored) != bytes(mine):  # bytes compare with memcmp; a memoryview's is per item
            return False
    return True


# -- writing --------------------------------------------------------------------------------------

@dataclass
class PatchReport:
    """What `patch` did, by name."""

    rewritten: list[str] = field(default_factory=list)  # stored initializers with new values
    unchanged: list[str] = field(default_factory=list)  # replacements equal to what the name already read
    materialized: list[str] = field(default_factory=list)  # Identity names that became initializers
    from_float_data: list[str] = field(default_factory=list)  # rewritten as raw_data (were float_data)
    appended: list[str] = field(default_factory=list)  # the appendix's initializers, written
    appended_nodes: int = 0
    appended_inputs: list[str] = field(default_factory=list)
    appended_outputs: list[str] = field(default_factory=list)
    bytes_written: int = 0


@dataclass(frozen=True)
class Appendix:
    """Graph fields `patch` adds, each after the source's last field of its kind: `nodes` (onnx
    NodeProto, after every node of the graph, so they may read any value of it), graph `inputs` and
    `outputs` (ValueInfoProto), and float32 `initializers` declared by name and dims (TensorProto without
    data): their values come among the replacements and are written as a replaced weight is.
    `min_opset`: the default-domain opset the nodes need."""

    nodes: tuple = ()
    inputs: tuple = ()
    outputs: tuple = ()
    initializers: tuple = ()
    min_opset: int = 1


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaNs and signed zeros included), the equality a byte-identical copy needs."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def patch(src_onnx: str | os.PathLike, dst_onnx: str | os.PathLike,
          replacements: dict[str, np.ndarray], appended: Appendix | None = None) -> PatchReport:
    """Write `dst_onnx`, a copy of `src_onnx` in which the named float32 tensors hold the given values,
    and with `appended`'s fields added (the values of its initializers among `replacements`).

    A name is an initializer's, or the output of an `Identity` node that reads one (the exporter's
    way of storing equal tensors once): such a name becomes its own initializer and its node is
    dropped. A replacement equal to what its name already reads changes nothing. Refused: a change
    to a tensor that another name, not replaced, also reads through `Identity`; unknown names; shapes
    or dtypes other than the graph's (or the appendix's); an appended name the graph already has, or an
    opset below the appendix's; external data; a malformed file; a result over 2 GiB.
    """
    src, dst = Path(src_onnx), Path(dst_onnx)
    source = _Source(src)
    try:
        plan = _plan(source, replacements, appended)
        with files.atomic_path(dst) as tmp:
            with open(tmp, "wb") as out:
                _write(source, plan, out)
            written = tmp.stat().st_size
            if written != plan.size:
                raise WritebackError(f"{dst}: wrote {written} bytes, planned {plan.size}; this is a bug")
    finally:
        source.close()
    plan.report.bytes_written = plan.size
    for name in plan.report.from_float_data:
        log.info("%s: %s was stored as float_data; written as raw_data", dst, name)
    return plan.report


@dataclass
class _Plan:
    index: _Index
    rewrite: dict[str, np.ndarray]  # stored name -> new value
    new: dict[str, np.ndarray]  # Identity output name -> value of its new initializer
    drop: set[int]  # start offsets of the Identity nodes to drop
    report: PatchReport
    size: int = 0
    graph_body: int = 0
    tensor_bodies: dict[int, list] = field(default_factory=dict)  # initializer start -> pieces
    # Added fields by the graph field they follow (its start; None: before the first): serialised
    # fields (bytes), or (name, value) of a new initializer, serialised one at a time when written.
    added: dict[int | None, list] = field(default_factory=dict)


class _Reads:
    """What each name of the graph reads, before and after the patch, following Identity nodes.

    Every chain is walked once (a loop, not recursion, and memoised: a hostile file can chain many
    Identity nodes), and every comparison with a stored tensor is streamed from the file and
    memoised, since many Identity names can read one large tensor."""

    def __init__(self, source: _Source, index: _Index, values: dict[str, np.ndarray]):
        self.source, self.index, self.values = source, index, values
        self.roots: dict[str, str | None] = {}  # name -> its stored initializer (None: none)
        self.compared: dict[tuple[str, int], bool] = {}  # (stored name, id of a value in `values`) -> equal
        self.finals: dict[str, np.ndarray | None] = {}

    def root(self, name: str) -> str:
        """The stored initializer `name` reads, following Identity nodes."""
        index, roots = self.index, self.roots
        chain, seen, at = [], set(), name
        while at not in index.tensors and at not in roots:
            if at not in index.identity or at in seen:
                break
            chain.append(at)
            seen.add(at)
            at = index.identity[at].inputs[0]
        found = at if at in index.tensors else roots.get(at)
        for link in chain:
            roots[link] = found
        if found is None:
            raise WritebackError(
                f"{self.source.path}: {name!r} is neither an initializer nor an Identity of one in this "
                "graph; give the graph's own names (module_weights_to_graph(encoder, graph) gives them)")
        return found

    def stored_is(self, name: str, array: np.ndarray) -> bool:
        """Whether `array` equals what `name` stores now. Streamed from the file, never held, so the
        plan costs no second copy of the replaced tensors."""
        key = (self.root(name), id(array))
        if key not in self.compared:
            self.compared[key] = _stored_equals(self.source, self.index.tensors[key[0]], array)
        return self.compared[key]

    def final(self, name: str) -> np.ndarray | None:
        """What `name` reads after the patch; None when that is its unchanged stored value."""
        index, values, finals = self.index, self.values, self.finals
        chain, at = [], name
        while at not in values and at not in index.tensors and at not in finals:
            chain.append(at)
            at = index.identity[at].inputs[0]
        found = values[at] if at in values else finals.get(at)
        for link in chain:
            finals[link] = found
        return found


def _plan(source: _Source, replacements: dict[str, np.ndarray], appended: Appendix | None) -> _Plan:
    index = _index(source)
    _refuse_external(source, index)
    values = _float32_values(source.path, replacements)
    declared = _appended_values(source, index, appended, values) if appended is not None else {}
    reads = _Reads(source, index, values)
    _check_values(source, index, values, reads)
    report = PatchReport()
    rewrite, new, drop = {}, {}, set()
    for name, array in values.items():
        if name in index.tensors:
            if reads.stored_is(name, array):
                report.unchanged.append(name)
            else:
                rewrite[name] = array
                report.rewritten.append(name)
        else:
            old = reads.final(index.identity[name].inputs[0])
            if reads.stored_is(name, array) if old is None else bitwise_equal(array, old):
                report.unchanged.append(name)
            else:
                new[name] = array
                drop.add(index.identity[name].span.start)
                report.materialized.append(name)
    _refuse_unreplaced_readers(source.path, index, values, reads)
    plan = _Plan(index, rewrite, new, drop, report)
    plan.added = _added(index, new, appended, declared, report)
    _layout(source, plan)
    if plan.size > MAX_OUTPUT:
        raise WritebackError(f"{source.path}: the result would be {plan.size} bytes, over protobuf's 2 GiB "
                             "limit for one ONNX file; keep these weights in the pipeline file instead")
    return plan


def _appended_values(source: _Source, index: _Index, appended: Appendix, values: dict[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
    """The values of the appendix's initializers, taken out of `values` and checked against their
    declarations; refuses an appended name the graph already has and a graph older than the appendix."""
    path = source.path
    opset = _opset(source, index)
    if opset is None or opset < appended.min_opset:
        raise WritebackError(f"{path}: default-domain opset {opset}; what is appended needs opset "
                             f"{appended.min_opset} or later: export the model again with a later opset")
    new = [t.name for t in appended.initializers] + [v.name for v in appended.inputs]
    new += [out for node in appended.nodes for out in node.output]
    taken = sorted((set(new) & (index.defined | set(index.tensors) | set(index.identity)))
                   | ({v.name for v in appended.outputs} & set(index.outputs)))
    if taken or len(set(new)) != len(new):
        raise WritebackError(f"{path}: the graph already has a value named {(taken or new)[0]!r}; what is "
                             "appended must add names of its own")
    declared = {}
    for t in appended.initializers:
        if t.name not in values:
            raise WritebackError(f"{path}: no value given for the appended initializer {t.name!r}")
        value = declared[t.name] = values.pop(t.name)
        if t.data_type != FLOAT or list(value.shape) != list(t.dims):
            raise WritebackError(f"{path}: the value for the appended {t.name!r} has shape "
                                 f"{list(value.shape)}, declared {list(t.dims)} (float32)")
    return declared


def _added(index: _Index, new: dict[str, np.ndarray], appended: Appendix | None,
           declared: dict[str, np.ndarray], report: PatchReport) -> dict[int | None, list]:
    """Every field to add, by the graph field it follows: each kind after the source's last field of its
    number (5: the initializers, materialised ones first), else after the last of a lower number."""
    def field_bytes(number: int, proto) -> bytes:
        data = proto.SerializeToString()
        return _key(number, LENGTH) + _encode_varint(len(data)) + data

    kinds = {5: [*new.items(), *declared.items()]}
    if appended is not None:
        kinds[1] = [field_bytes(1, node) for node in appended.nodes]
        kinds[11] = [field_bytes(11, value) for value in appended.inputs]
        kinds[12] = [field_bytes(12, value) for value in appended.outputs]
        report.appended, report.appended_nodes = list(declared), len(appended.nodes)
        report.appended_inputs = [v.name for v in appended.inputs]
        report.appended_outputs = [v.name for v in appended.outputs]
    added: dict[int | None, list] = {}
    for number, entries in sorted(kinds.items()):
        same = [f.start for f in index.graph_fields if f.number == number]
        lower = [f.start for f in index.graph_fields if f.number < number]
        anchor = same[-1] if same else lower[-1] if lower else None
        added.setdefault(anchor, []).extend(entries)
    return added


def _added_bytes(entry) -> bytes:
    return entry if isinstance(entry, bytes) else _new_field(*entry)


def _float32_values(path: Path, replacements: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The replacements as little-endian float32 arrays; any other dtype is refused."""
    values: dict[str, np.ndarray] = {}
    for name, array in replacements.items():
        array = np.asarray(array)
        if array.dtype != np.float32:
            raise WritebackError(f"{path}: the value for {name!r} is {array.dtype}; give float32 arrays "
                                 "(the graph's weights are float32)")
        if array.dtype != np.dtype("<f4"):  # a big-endian machine's float32: the file is little-endian
            array = array.astype("<f4")
        values[name] = array  # as given (views included): copied a chunk at a time when compared or written
    return values


def _check_values(source: _Source, index: _Index, values: dict[str, np.ndarray], reads: _Reads) -> None:
    """Refuse a name the graph does not store a float32 tensor under, or a value of another shape."""
    path = source.path
    for name, array in values.items():
        if name in index.tensors and name in index.identity:
            raise source.malformed(f"{name!r} is both an initializer and an Identity output")
        t = index.tensors[reads.root(name)]
        if t.data_type != FLOAT:
            raise WritebackError(f"{path}: {name!r} is stored as data type {t.data_type}, not float32 (1); "
                                 "only float32 weights are written back: export the model in float32")
        if list(array.shape) != t.dims:
            raise WritebackError(f"{path}: the value for {name!r} has shape {list(array.shape)}, the graph's "
                                 f"is {t.dims} (linear weights go in as [in, out]; module_weights_to_graph "
                                 "gives the graph's layout)")


def _refuse_unreplaced_readers(path: Path, index: _Index, values: dict[str, np.ndarray],
                               reads: _Reads) -> None:
    """A name not replaced that reads a changed tensor through Identity would silently change too."""
    for name, node in index.identity.items():
        if name in values or name in index.tensors:
            continue
        try:
            stored = reads.root(name)
        except WritebackError:
            continue  # an Identity of a computed value; no weight of ours
        after = reads.final(node.inputs[0])
        if after is not None and not reads.stored_is(stored, after):
            via = next(n for n in [node.inputs[0], stored] if n in values)
            raise WritebackError(
                f"{path}: {via!r} changes, but {name!r} reads the same stored tensor {stored!r} through an "
                f"Identity node and is not replaced; give {name!r} a value too (the old one to keep it)")


def _tensor_pieces(source: _Source, t: _Tensor, value: np.ndarray, report: PatchReport) -> list:
    """The tensor's fields with its data replaced by one raw_data field where the first data field was."""
    pieces, placed = [], False
    for f in t.parts:
        if f.number in OTHER_DATA or f.number == 3:
            kind = OTHER_DATA.get(f.number, "segment")
            raise source.malformed(f"float32 tensor {t.name!r} has a {kind} field")
        if f.number in (4, 9):
            if f.number == 4 and t.name not in report.from_float_data:
                report.from_float_data.append(t.name)
            if not placed:
                pieces.append(_key(9, LENGTH) + _encode_varint(value.nbytes))
                pieces.append(value)
                placed = True
            continue
        pieces.append((f.start, f.end))
    if not placed:
        raise source.malformed(f"tensor {t.name!r} has no data")
    return pieces


def _size(pieces) -> int:
    return sum(p[1] - p[0] if isinstance(p, tuple) else p.nbytes if isinstance(p, np.ndarray) else len(p)
               for p in pieces)


def _layout(source: _Source, plan: _Plan) -> None:
    """Work out every replaced piece and the result's size before anything is written."""
    index = plan.index
    for name, value in plan.rewrite.items():
        t = index.tensors[name]
        body = _tensor_pieces(source, t, value, plan.report)
        plan.tensor_bodies[t.span.start] = [_key(5, LENGTH) + _encode_varint(_size(body))] + body
    graph_size = sum(len(_added_bytes(entry)) for entries in plan.added.values() for entry in entries)
    for f in index.graph_fields:
        if f.start in plan.drop:
            continue
        body = plan.tensor_bodies.get(f.start)
        graph_size += _size(body) if body is not None else f.end - f.start
    plan.graph_body = graph_size
    size = 0
    for f in index.model_fields:
        if f is index.graph:
            size += len(_key(7, LENGTH) + _encode_varint(graph_size)) + graph_size
        else:
            size += f.end - f.start
    plan.size = size


def _new_field(name: str, value: np.ndarray) -> bytes:
    """The graph's initializer field for a materialised Identity name; made when needed, never kept."""
    from onnx import numpy_helper

    encoded = numpy_helper.from_array(value, name).SerializeToString()
    return _key(5, LENGTH) + _encode_varint(len(encoded)) + encoded


def _write_added(plan: _Plan, after: int | None, out) -> None:
    for entry in plan.added.get(after, ()):
        out.write(_added_bytes(entry))


def _write_pieces(source: _Source, pieces, out) -> None:
    for p in pieces:
        if isinstance(p, tuple):
            source.copy(p[0], p[1], out)
        elif isinstance(p, np.ndarray):
            for chunk in _chunks(p):
                out.write(chunk)
        else:
            out.write(p)


def _write(source: _Source, plan: _Plan, out) -> None:
    index = plan.index
    for f in index.model_fields:
        if f is not index.graph:
            source.copy(f.start, f.end, out)
            continue
        out.write(_key(7, LENGTH) + _encode_varint(plan.graph_body))
        _write_added(plan, None, out)
        for g in index.graph_fields:
            if g.start not in plan.drop:
                body = plan.tensor_bodies.get(g.start)
                _write_pieces(source, body if body is not None else [(g.start, g.end)], out)
            _write_added(plan, g.start, out)  # a dropped Identity node can be the last node


# -- reading without writing ----------------------------------------------------------------------

class StreamedGraph:
    """A graph file indexed as `patch` indexes it, never loaded whole: its `layout` (what names the
    weights, `onnx.names`) and, on request, one float32 initializer's values.

        with StreamedGraph("model.onnx") as graph:
            names = onnx.names.weight_names(graph.layout, graph.value)

    External data is refused here, as `patch` refuses it: a copy of the file would not carry it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._source = _Source(self.path)
        try:
            self._index = _index(self._source)
            _refuse_external(self._source, self._index)
            self.layout = _names_layout(self._source, self._index)
        except BaseException:
            self._source.close()
            raise

    def value(self, stored: str) -> np.ndarray:
        """The stored float32 values of initializer `stored` (check its data type first)."""
        return _old_value(self._source, self._index.tensors[stored])

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> StreamedGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
