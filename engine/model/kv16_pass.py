"""Float16 (or int16 or int8) KV on the CPU: the live cache in 16 (8) bits where the
engine's kernel runs attention.

After `own_attention_moves` (engine.model.graph_passes) has moved GroupQueryAttention nodes
to the engine's kernel, `half_kv` retypes the graph's past inputs and present outputs from
FLOAT to FLOAT16 and moves the nodes to `engine.kernels::GroupQueryAttentionF16KV`
(engine/kernels/decode_attention.c): queries, new keys and values and the output stay
float32; each new key (after rotary) and value is rounded to float16 once, written into the
cache, and every read of the cache (a chunk's own tokens included) converts it back, so a
token's output has the same bits on every path, as with float32 KV. Half the KV bytes per
token (docs/kv-and-scheduling.md has the measured agreement with float32 KV).

`cache_kv(data, "int8", dims)` does the same for `GroupQueryAttentionI8KV`: each cache row
(one token, one KV head) is head_size int8 values and their scale (largest |x| / 127,
rounded to a bfloat16), head_size + 2 bytes, so the tensors' last dimension becomes
head_size + 2: a quarter of float32's bytes and a bit (25.8% at head size 64), half of
float16's.

`cache_kv(data, "int16", dims)`: `GroupQueryAttentionI16KV`, each row head_size int16 whole
numbers and their scale (largest |x| / `i16_row_limit(head_size)`, rounded up to a
bfloat16) in one more int16, head_size + 1 int16 a row (1.6% more than float16 at head
size 64). The kernel runs the attention on the whole numbers (VPDPWSSD on AVX-512 VNNI or AVX-VNNI),
exact sums in int32, so every path gives the same bits without a promised order of
additions.

All or nothing per model: every GroupQueryAttention node must run the engine's kernel, its
past and present must be float32 graph inputs and outputs, read by no other node (a `Shape`
aside) and given to no other attention node; else the graph keeps float32 KV and the reason.
Like the other passes, the edit is made on the protobuf bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.model import onnx_proto as proto
from engine.model.graph_passes import KERNEL_DOMAIN, _node_parts, _parse, _with_graph
from engine.model.onnx_scan import _Reader, _scan_value_info

#: The engine kernel's GroupQueryAttention over a float16 cache, an int8 one, an int16 one.
F16_OP = "GroupQueryAttentionF16KV"
I8_OP = "GroupQueryAttentionI8KV"
I16_OP = "GroupQueryAttentionI16KV"
#: An int8 cache row's scale: a bfloat16 after the row's values.
I8_SCALE_BYTES = 2
#: An int16 cache row's scale: a bfloat16 (one int16) after the row's whole numbers.
I16_SCALE_ELEMS = 1
#: The positions whose weighted values the kernel sums at once (decode_attention.c's TILE).
_TILE = 64


def i16_limit(n: int) -> int:
    """The largest M with n * M * M < 2^31: n products of whole numbers within +-M sum
    exactly in int32."""
    m = int(((2 ** 31 - 1) // n) ** 0.5)
    while n * (m + 1) ** 2 < 2 ** 31:
        m += 1
    while n * m * m >= 2 ** 31:
        m -= 1
    return m


def i16_row_limit(head_dim: int) -> int:
    """The largest |q| of an int16 cache row of `head_dim` values (5,792 for heads of 64 or
    less, 4,095 for 128): a score's head_dim products and the kernel's tile of weighted
    values both sum exactly."""
    return i16_limit(max(head_dim, _TILE))


def row_extra(element: str) -> int:
    """The elements a cache row of `element` holds beyond its head_size values (its scale)."""
    return I8_SCALE_BYTES if element == "int8" else I16_SCALE_ELEMS if element == "int16" else 0
#: Ops that may read a past input besides attention: they do not look at its values.
_TYPE_BLIND = frozenset({"Shape"})


def half_kv(data: bytes) -> tuple[bytes | None, str | None]:
    """`data` (its attention already moved to the engine's kernel) with float16 past and
    present tensors, or (None, why the KV stays float32)."""
    return cache_kv(data, "float16", {})


def cache_kv(data: bytes, element: str, head_dims: dict[str, int]
             ) -> tuple[bytes | None, str | None]:
    """`half_kv` for `element` "float16", "int16" or "int8"; int8 and int16 need each past
    and present tensor's head size (`head_dims`, by name) for its rows' new length."""
    op, elem = {"int8": (I8_OP, proto.INT8), "int16": (I16_OP, proto.INT16)}.get(
        element, (F16_OP, proto.FLOAT16))
    parsed = _parse(data)
    if parsed is None:
        return None, "the graph could not be read"
    view, graph = parsed
    g0, g1 = graph.span
    r = _Reader(view, g0, g1)
    attention: list[tuple[int, int]] = []
    caches: set[str] = set()
    presents: set[str] = set()
    others: list[tuple[str, list[str]]] = []  # (op type, inputs) of every other node
    types: dict[tuple[int, str], int] = {}  # (field, name) -> elem type of graph in/outputs
    for number, wire, value in r.fields():
        if wire != 2:
            continue
        if number == 1:
            g = next(n for n in graph.nodes if n.start == r.field_start)
            if g.node.op_type != "GroupQueryAttention":
                others.append((g.node.op_type, g.node.inputs))
                continue
            parts = _node_parts(view, g)
            if parts.domain != KERNEL_DOMAIN:
                return None, "not every GroupQueryAttention node runs the engine's kernel"
            if len(parts.inputs) < 5 or len(parts.outputs) < 3:
                return None, "an attention node without its past and present KV"
            attention.append((g.start, g.end))
            caches.update(parts.inputs[3:5])
            presents.update(parts.outputs[1:3])
        elif number in (11, 12):
            info = _scan_value_info(r.sub(value))
            types[(number, info.name)] = info.elem_type
    if not attention:
        return None, "no GroupQueryAttention node runs the engine's kernel"
    if len(caches) != 2 * len(attention) or len(presents) != 2 * len(attention):
        return None, "attention nodes share a KV tensor"
    if any(types.get((11, name)) != proto.FLOAT for name in caches):
        return None, "a past KV input is not a float32 graph input"
    if any(types.get((12, name)) != proto.FLOAT for name in presents):
        return None, "a present KV output is not a float32 graph output"
    for other, inputs in others:
        if other not in _TYPE_BLIND and caches.intersection(inputs):
            return None, f"a {other} node reads the past KV"
        if presents.intersection(inputs):
            return None, f"a {other} node reads the present KV"
    if elem != proto.FLOAT16 and any(name not in head_dims for name in caches | presents):
        return None, "a KV tensor's head size is not known"
    out = bytearray()
    r = _Reader(view, g0, g1)
    starts = {s for s, _ in attention}
    for number, wire, value in r.fields():
        raw = view[r.field_start:r.pos]
        if number == 1 and wire == 2 and r.field_start in starts:
            out += proto._bytes(1, _renamed_op(view, value, op))
        elif number in (11, 12, 13) and wire == 2 and \
                (name := _scan_value_info(r.sub(value)).name) in (caches | presents):
            row = head_dims[name] + row_extra(element) if elem != proto.FLOAT16 else None
            out += proto._bytes(number, _cache_info(view, value, elem, row))
        else:
            out += raw
    return _with_graph(view, bytes(out)), None


def _renamed_op(view: memoryview, span: tuple[int, int], op_type: str) -> bytes:
    """A NodeProto's bytes with another op_type (field 4)."""
    body = _Reader(view, *span)
    out = bytearray()
    for number, wire, _ in body.fields():
        raw = view[body.field_start:body.pos]
        out += proto._str(4, op_type) if (number, wire) == (4, 2) else raw
    return bytes(out)


def _cache_info(view: memoryview, span: tuple[int, int], elem: int, last: int | None) -> bytes:
    """A ValueInfoProto's bytes with its tensor's element type `elem` and, where `last` is
    given, its last dimension that many, the rest as it was."""
    def shape(span: tuple[int, int]) -> bytes:
        body = _Reader(view, *span)
        dims = [(body.field_start, body.pos) for number, wire, _ in body.fields()
                if (number, wire) == (1, 2)]
        out = bytearray()
        body = _Reader(view, *span)
        for _number, _wire, _ in body.fields():
            raw = view[body.field_start:body.pos]
            out += proto._bytes(1, proto._int(1, last)) if last is not None and dims and \
                (body.field_start, body.pos) == dims[-1] else raw
        return bytes(out)

    def tensor_type(span: tuple[int, int]) -> bytes:
        body = _Reader(view, *span)
        out = bytearray()
        for number, wire, value in body.fields():
            raw = view[body.field_start:body.pos]
            if (number, wire) == (1, 0):
                out += proto._int(1, elem)  # TensorProto.elem_type
            elif (number, wire) == (2, 2):
                out += proto._bytes(2, shape(value))  # TensorShapeProto
            else:
                out += raw
        return bytes(out)

    def nested(span: tuple[int, int], field: int,
               inner: Callable[[tuple[int, int]], bytes]) -> bytes:
        body = _Reader(view, *span)
        out = bytearray()
        for number, wire, value in body.fields():
            raw = view[body.field_start:body.pos]
            out += proto._bytes(number, inner(value)) if (number, wire) == (field, 2) else raw
        return bytes(out)

    # ValueInfoProto.type (2) -> TypeProto.tensor_type (1) -> elem_type (1), shape (2)
    return nested(span, 2, lambda v: nested(v, 1, tensor_type))
