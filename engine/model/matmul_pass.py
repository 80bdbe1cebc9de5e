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
from dataclasses import dataclass

from engine.model import onnx_proto as proto
from engine.model.graph_passes import (
    KERNEL_DOMAIN,
    _dynamic,
    _Graph,
    _GraphNode,
    _node_parts,
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
#: Why fp32-accuracy nodes keep ONNX Runtime's kernel without `fp32` (a CPU with AVX2 but
#: not AVX-512 VNNI: the engine's kernel has vector code for accuracy level 4 only there).
FP32_SLOW = "fp32 accuracy without AVX-512 VNNI (ONNX Runtime's kernel is faster there)"


def own_matmul_moves(data: bytes, *, eight_bit: bool = False, fp32: bool = True
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
    nodes = moved = 0
    #: node index -> its new bytes (b"" drops it)
    edits: dict[int, bytes] = {}
    fusions = _offset_fusions(graph, dynamic)
    for index, g in enumerate(graph.nodes):
        if g.node.op_type != "MatMulNBits":
            continue
        nodes += 1
        fused = fusions.get(index)
        node = _own_matmul_node(view, g, dynamic, graph.init_types, half, fused)
        if isinstance(node, bytes) and not eight_bit and _int(view, g, "bits", 4) == 8:
            node = EIGHT_BIT
        if isinstance(node, bytes) and not fp32 and _int(view, g, "accuracy_level", 0) != 4:
            node = FP32_SLOW
        if isinstance(node, str):
            kept[node] += 1
            continue
        moved += 1
        if fused is None:
            edits[index] = proto._bytes(1, node)
            continue
        # the node takes the Add's place (its offsets may be computed after the
        # MatMulNBits); the Add and the block sums' MatMul go
        edits[index] = b""
        edits[fused.add] = proto._bytes(1, node)
        edits[fused.matmul] = b""
    if not moved:
        return None, nodes, kept
    edits.update(_unread(graph, edits))
    out = bytearray()
    pos = g0
    for index in sorted(edits):
        g = graph.nodes[index]
        out += view[pos:g.start]
        out += edits[index]
        pos = g.end
    out += view[pos:g1]
    opset = b"" if _imports(view, KERNEL_DOMAIN) else \
        proto._bytes(8, proto._str(1, KERNEL_DOMAIN) + proto._int(2, 1))
    return _with_graph(view, bytes(out), opset), nodes, kept


@dataclass(frozen=True)
class _Fusion:
    """`Add(MatMulNBits(x), MatMul(ReduceSum(Reshape(x, [0, 0, blocks, block])), offsets))`
    (the importer's int4 blocks with a minimum, engine.model.gguf_blocks): node indices
    and the names the fused node takes."""

    add: int
    matmul: int
    offsets: str
    output: str
    block: int  # the block sums' block, which must be the node's


def _offset_fusions(graph: _Graph, dynamic: set[str]) -> dict[int, _Fusion]:
    """The MatMulNBits nodes (by index) whose block-minimum correction the engine's kernel
    can take in (its `offsets` input)."""
    producer = {o: i for i, g in enumerate(graph.nodes) for o in g.node.outputs if o}
    readers: dict[str, list[int]] = {}
    for i, g in enumerate(graph.nodes):
        for name in g.node.inputs:
            readers.setdefault(name, []).append(i)
    found: dict[int, _Fusion] = {}
    for i, g in enumerate(graph.nodes):
        if g.node.op_type != "MatMulNBits" or not g.node.outputs:
            continue
        y = g.node.outputs[0]
        if y in graph.outputs or len(readers.get(y, [])) != 1:
            continue
        add = graph.nodes[readers[y][0]]
        if add.node.op_type != "Add" or len(add.node.inputs) != 2:
            continue
        extra = add.node.inputs[1] if add.node.inputs[0] == y else add.node.inputs[0]
        m = producer.get(extra)
        if m is None or len(readers.get(extra, [])) != 1:
            continue
        mm = graph.nodes[m].node
        if mm.op_type != "MatMul" or len(mm.inputs) != 2 or mm.inputs[1] in dynamic:
            continue
        r = producer.get(mm.inputs[0])
        if r is None or graph.nodes[r].node.op_type != "ReduceSum":
            continue
        sums = graph.nodes[r].node
        if len(sums.inputs) < 2 or graph.ints.get(sums.inputs[1]) not in ([-1], [3]):
            continue
        s = producer.get(sums.inputs[0])
        if s is None or graph.nodes[s].node.op_type != "Reshape":
            continue
        shape = graph.nodes[s].node
        if shape.inputs[0] != g.node.inputs[0] or len(shape.inputs) < 2 \
                or len(graph.ints.get(shape.inputs[1], [])) != 4 \
                or graph.ints[shape.inputs[1]][:2] != [0, 0]:
            continue
        found[i] = _Fusion(readers[y][0], m, mm.inputs[1], add.node.outputs[0],
                           graph.ints[shape.inputs[1]][3])
    return found


def _unread(graph: _Graph, edits: dict[int, bytes]) -> dict[int, bytes]:
    """The block sums (ReduceSum, Reshape) no node reads any more once `edits` drop
    their MatMuls: dropped too."""
    dropped = {i for i, b in edits.items() if not b}
    more: dict[int, bytes] = {}
    changed = True
    while changed:
        changed = False
        read = {name for i, g in enumerate(graph.nodes) if i not in dropped
                for name in g.node.inputs}
        for i, g in enumerate(graph.nodes):
            if i in dropped or g.node.op_type not in ("ReduceSum", "Reshape"):
                continue
            outputs = [o for o in g.node.outputs if o]
            if outputs and not any(o in read or o in graph.outputs for o in outputs):
                dropped.add(i)
                more[i] = b""
                changed = True
    return more


def _int(view: memoryview, g: _GraphNode, name: str, default: int) -> int:
    """A node's integer attribute `name` (`default` when absent)."""
    r = _Reader(view, g.start, g.end)
    r.varint()
    length = r.varint()
    body = _Reader(view, r.pos, r.pos + length)
    for number, wire, value in body.fields():
        if number == 5 and wire == 2:
            fields = list(body.sub(value).fields())
            if any(n == 1 and w == 2 and body.text(v) == name for n, w, v in fields):
                return next((v for n, w, v in fields if n == 3 and w == 0), default)
    return default


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
                     types: dict[str, int], half: bool, fused: _Fusion | None = None
                     ) -> bytes | str:
    """The node for the engine's kernel, or why it keeps ONNX Runtime's."""
    parts = _node_parts(view, g)
    inputs, outputs, domain = parts.inputs, parts.outputs, parts.domain
    why = parts.unhandled(_ATTRIBUTES)
    if why is not None:
        return why
    ints = {name: v for name, v in parts.attributes.items() if v is not None}
    if domain != "com.microsoft":
        return f"operator of domain {domain or 'ai.onnx'}"
    why = _not_covered(inputs, ints, dynamic, types, half)
    if why is not None:
        return why
    if fused is not None and fused.block != ints.get("block_size"):
        return "block sums in other blocks than the weights'"
    if fused is not None:  # offsets go in as the seventh input, the Add's output out
        inputs = inputs + [""] * (_INPUTS - len(inputs)) + [fused.offsets]
        outputs = [fused.output]
    return parts.rebuilt(inputs, outputs)


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
