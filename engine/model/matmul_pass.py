"""Moves ``com.microsoft::MatMulNBits`` nodes to the engine's own kernel at load.

engine/kernels/matmul_nbits.c takes the same inputs, outputs and attributes and computes
each output row the same way, bit for bit, whatever the number of rows in the call (a decode
step, a prefill chunk, a verify pass) and the number of threads; ONNX Runtime's kernel does
not (see the C file). A node moves when the kernel covers it: fp32 activations and scales,
4- or 8-bit constant weights in blocks of 16 to 256, uint8 zero points or none, no
``g_idx``. The others keep ONNX Runtime's kernel, each with its reason counted.

Like `graph_passes.own_attention`, the edit is made on the protobuf bytes; the caller
registers the kernels' library with the session.
"""

from __future__ import annotations

from collections import Counter

from engine.model import onnx_proto as proto
from engine.model.graph_passes import (
    KERNEL_DOMAIN,
    _dynamic,
    _GraphNode,
    _parse,
    _Reader,
    _with_graph,
)

#: MatMulNBits attributes the engine's kernel reads; a node with another keeps ONNX Runtime's.
_ATTRIBUTES = frozenset({"K", "N", "bits", "block_size", "accuracy_level"})
#: A, B, scales, zero_points, g_idx, bias.
_INPUTS = 6


#: Why 8-bit nodes keep ONNX Runtime's kernel unless asked (`eight_bit`): its 8-bit path
#: already gives a row the same bits at any row and thread count (ONNX Runtime 1.32 on
#: x86-64, tests/engine/kernels/test_matmul_nbits.py), and a GGUF import's folder then
#: computes exactly what onnxruntime-genai computes on it.
EIGHT_BIT = "8-bit weights (ONNX Runtime's kernel unless ONNX_GENAI_MATMUL=all)"


def own_matmul_moves(data: bytes, *, eight_bit: bool = False
                     ) -> tuple[bytes | None, int, Counter[str]]:
    """`data` with the MatMulNBits nodes the engine's kernel covers moved to it (None when
    none is; 8-bit ones only with `eight_bit`), the graph's MatMulNBits node count, and why
    the others keep ONNX Runtime's kernel (a reason each, counted)."""
    kept: Counter[str] = Counter()
    parsed = _parse(data)
    if parsed is None:
        kept["the graph could not be read"] += 1
        return None, 0, kept
    view, graph = parsed
    dynamic = _dynamic(graph)
    #: fp16 graphs (fp16 inputs) may compute fp16 scales: only fp32 initializers then
    half = proto.FLOAT16 in graph.inputs.values()
    g0, g1 = graph.span
    out = bytearray()
    pos = g0
    nodes = moved = 0
    for g in graph.nodes:
        if g.node.op_type != "MatMulNBits":
            continue
        nodes += 1
        node = _own_matmul_node(view, g, dynamic, graph.init_types, half)
        if not eight_bit and isinstance(node, bytes) and _bits(view, g) == 8:
            node = EIGHT_BIT
        if isinstance(node, str):
            kept[node] += 1
            continue
        out += view[pos:g.start]
        out += proto._bytes(1, node)
        pos = g.end
        moved += 1
    if not moved:
        return None, nodes, kept
    out += view[pos:g1]
    opset = b"" if _imports(view, KERNEL_DOMAIN) else \
        proto._bytes(8, proto._str(1, KERNEL_DOMAIN) + proto._int(2, 1))
    return _with_graph(view, bytes(out), opset), nodes, kept


def _bits(view: memoryview, g: _GraphNode) -> int:
    """A MatMulNBits node's `bits` attribute (4 when absent)."""
    r = _Reader(view, g.start, g.end)
    r.varint()
    length = r.varint()
    body = _Reader(view, r.pos, r.pos + length)
    for number, wire, value in body.fields():
        if number == 5 and wire == 2:
            fields = list(body.sub(value).fields())
            if any(n == 1 and w == 2 and body.text(v) == "bits" for n, w, v in fields):
                return next((v for n, w, v in fields if n == 3 and w == 0), 4)
    return 4


def _imports(view: memoryview, domain: str) -> bool:
    """Whether the model already imports `domain` (the attention pass ran first)."""
    top = _Reader(view)
    for number, wire, value in top.fields():
        if number == 8 and wire == 2:
            r = top.sub(value)
            if any(n == 1 and w == 2 and r.text(v) == domain for n, w, v in r.fields()):
                return True
    return False


def _own_matmul_node(view: memoryview, g: _GraphNode, dynamic: set[str],
                     types: dict[str, int], half: bool) -> bytes | str:
    """The node for the engine's kernel, or why it keeps ONNX Runtime's."""
    r = _Reader(view, g.start, g.end)
    r.varint()  # the node field's key
    length = r.varint()
    body = _Reader(view, r.pos, r.pos + length)
    inputs: list[str] = []
    outputs: list[str] = []
    domain = ""
    ints: dict[str, int] = {}
    kept = bytearray()
    for number, wire, value in body.fields():
        raw = view[body.field_start:body.pos]
        if number == 1 and wire == 2:
            inputs.append(body.text(value))
        elif number == 2 and wire == 2:
            outputs.append(body.text(value))
        elif number == 7 and wire == 2:
            domain = body.text(value)
        else:
            if number == 5 and wire == 2:
                name, integer = "", None
                for n, w, v in body.sub(value).fields():
                    if n == 1 and w == 2:
                        name = body.text(v)
                    elif n == 3 and w == 0:
                        integer = v
                if name not in _ATTRIBUTES:
                    return f"attribute {name or '(unnamed)'} not handled"
                if integer is not None:
                    ints[name] = integer
            kept += raw
    while inputs and not inputs[-1]:
        inputs.pop()
    if domain != "com.microsoft":
        return f"operator of domain {domain or 'ai.onnx'}"
    why = _not_covered(inputs, ints, dynamic, types, half)
    if why is not None:
        return why
    node = bytearray()
    node += b"".join(proto._str(1, i) for i in inputs)
    node += b"".join(proto._str(2, o) for o in outputs)
    node += kept
    node += proto._str(7, KERNEL_DOMAIN)
    return bytes(node)


def _not_covered(inputs: list[str], ints: dict[str, int], dynamic: set[str],
                 types: dict[str, int], half: bool) -> str | None:
    """Why the kernel does not cover the node, or None. Weights, scales and zero points must
    be constants (initializers, or computed from them only: ONNX Runtime folds those at
    load, e.g. the importer's K-quant scales `d * sc`)."""
    bits, block = ints.get("bits", 4), ints.get("block_size", 0)
    if bits not in (4, 8):
        return f"{bits}-bit weights"
    if not 16 <= block <= 256 or block & (block - 1):
        return f"blocks of {block}"
    if len(inputs) < 3 or len(inputs) > _INPUTS:
        return "inputs not handled"
    if len(inputs) > 4 and inputs[4]:
        return "g_idx (act-order weights)"
    if inputs[1] in dynamic or inputs[2] in dynamic:
        return "weights that are not constants"
    if types.get(inputs[2], None if half else proto.FLOAT) != proto.FLOAT:
        return "fp16 activations and scales"
    if len(inputs) > 3 and inputs[3] and (inputs[3] in dynamic
                                          or types.get(inputs[3]) != proto.UINT8):
        return "zero points that are not constant uint8"
    if len(inputs) > 5 and inputs[5] in types and types[inputs[5]] != proto.FLOAT:
        return "bias that is not fp32"
    return None
