"""Load-time rewrites of a model's graph that change no result the engine uses.

Exports compute the LM head for every position of the input: a prefill of `n` tokens
multiplies `n` hidden states by the `[hidden, vocab]` head (SmolLM2-135M: 14% of a 512-token
prefill), though only the last row is sampled. `keep_last_logits` gives the graph an input
`logits_to_keep` (int64 `[1]`, Hugging Face's name for it) and slices the head's input to
that many last positions, so a prefill computes one row of logits and a speculative check
or prompt logprobs ask for all of them. The rows it returns are the same numbers as before
(the head multiplies each row alone).

The edit is made on the protobuf bytes (the packaged app has no ``onnx`` package): the graph
is copied field by field, two nodes, two constants and the input are added, and the head's
first input is renamed. The file on disk is untouched; ONNX Runtime gets the bytes and the
model's folder for its external weights. A graph whose logits come out any other way (a
head fed by something not position-wise, intermediates used elsewhere, an existing input of
that name) is left as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.model import onnx_proto as proto
from engine.model.onnx_scan import Node, ScanError, _Reader, _scan_value_info

LOGITS_TO_KEEP = "logits_to_keep"
_PREFIX = "/engine/logits_to_keep"
#: Ops the head's output may pass through to the logits: each row stays its own row.
_POSITIONWISE = frozenset({"Cast", "Tanh", "Mul", "Div", "Add", "Sub", "Identity"})
#: The head itself: `[..., seq, hidden] x [hidden, vocab]` (or its int4 form).
_HEADS = frozenset({"MatMul", "MatMulNBits"})
#: Graph files above this are not rewritten: their weights are inline and would be copied.
MAX_GRAPH_BYTES = 64 << 20


@dataclass
class _GraphNode:
    node: Node
    start: int  # the field's key, in the model bytes
    end: int


@dataclass
class _Graph:
    span: tuple[int, int]
    nodes: list[_GraphNode] = field(default_factory=list)
    #: Each graph input's element type (TensorProto.DataType).
    inputs: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, list[int | str | None]] = field(default_factory=dict)
    initializers: set[str] = field(default_factory=set)
    #: Each initializer's element type (TensorProto.DataType).
    init_types: dict[str, int] = field(default_factory=dict)
    #: Small int64 initializers' values (shapes, axes), to check a Reshape keeps the rows.
    ints: dict[str, list[int]] = field(default_factory=dict)


def _read_graph(view: memoryview) -> _Graph:
    top = _Reader(view)
    span = next((v for n, w, v in top.fields() if n == 7 and w == 2), None)
    if span is None:
        raise ScanError("no graph found")
    graph = _Graph(span)
    r = top.sub(span)
    for number, wire, value in r.fields():
        start = r.field_start
        if wire != 2:
            continue
        if number == 1:
            graph.nodes.append(_GraphNode(_node_io(r, value), start, r.pos))
        elif number == 5:
            name, values, elem = _small_ints(r, value)
            graph.initializers.add(name)
            graph.init_types[name] = elem
            if values is not None:
                graph.ints[name] = values
        elif number in (11, 12):
            info = _scan_value_info(r.sub(value))
            if number == 11:
                graph.inputs[info.name] = info.elem_type
            else:
                graph.outputs[info.name] = info.shape
    return graph


def _small_ints(r: _Reader, span: tuple[int, int]) -> tuple[str, list[int] | None, int]:
    """A TensorProto's name, its values when it is an int64 tensor of up to 8 held inline
    as raw data, and its element type."""
    name, elem, raw = "", 0, None
    for n, w, v in r.sub(span).fields():
        if n == 8 and w == 2:
            name = r.text(v)
        elif n == 2 and w == 0:
            elem = v
        elif n == 9 and w == 2 and v[1] - v[0] <= 64:
            raw = bytes(r.buf[v[0]:v[1]])
    if elem != proto.INT64 or raw is None or len(raw) % 8:
        return name, None, elem
    return name, np.frombuffer(raw, dtype="<i8").tolist(), elem


def _node_io(r: _Reader, span: tuple[int, int]) -> Node:
    """A node's type, inputs and outputs (its attributes are skipped, unread)."""
    node = Node()
    for n, w, v in r.sub(span).fields():
        if w == 2 and n == 1:
            node.inputs.append(r.text(v))
        elif w == 2 and n == 2:
            node.outputs.append(r.text(v))
        elif w == 2 and n == 4:
            node.op_type = r.text(v)
    return node


def _dynamic(graph: _Graph) -> set[str]:
    """Tensors that depend on a graph input (the rest are constants)."""
    dynamic = set(graph.inputs) - graph.initializers
    changed = True
    while changed:  # files are sorted, so one pass settles it; a second confirms
        changed = False
        for g in graph.nodes:
            if any(i in dynamic for i in g.node.inputs if i) and \
                    not all(o in dynamic for o in g.node.outputs):
                dynamic.update(g.node.outputs)
                changed = True
    return dynamic


def _find_head(graph: _Graph, logits: str) -> tuple[str, list[_GraphNode]] | None:
    """The tensor to slice so `logits` keeps the last rows only, and the nodes that read it
    for the head (its MatMul, and the block sums of an offset-corrected int4 head)."""
    producer = {o: g for g in graph.nodes for o in g.node.outputs if o}
    consumers: dict[str, int] = {}
    for g in graph.nodes:
        for i in g.node.inputs:
            consumers[i] = consumers.get(i, 0) + 1
    dynamic = _dynamic(graph)

    def only_reader(tensor: str) -> bool:
        return consumers.get(tensor, 0) == 1 and tensor not in graph.outputs

    def head(tensor: str) -> _GraphNode | None:
        node = producer.get(tensor)
        if node is None or node.node.op_type not in _HEADS:
            return None
        moving = [i for i in node.node.inputs if i in dynamic]
        return node if len(moving) == 1 and moving == node.node.inputs[:1] else None

    tensor = logits
    while True:
        found = head(tensor)
        if found is not None:
            return found.node.inputs[0], [found]
        step = producer.get(tensor)
        if step is None:
            return None
        moving = [i for i in step.node.inputs if i in dynamic]
        if step.node.op_type == "Add" and len(moving) == 2:
            return _offset_corrected(graph, step, producer, dynamic, head, only_reader)
        if step.node.op_type not in _POSITIONWISE or len(moving) != 1:
            return None
        tensor = moving[0]  # the row-wise op's other inputs are constants (broadcast)
        if not only_reader(tensor):
            return None  # someone else reads the unsliced tensor


def _offset_corrected(graph: _Graph, add: _GraphNode, producer: dict[str, _GraphNode],
                      dynamic: set[str], head: Callable[[str], _GraphNode | None],
                      only_reader: Callable[[str], bool]
                      ) -> tuple[str, list[_GraphNode]] | None:
    """`Add(MatMulNBits(x), MatMul(block_sums(x), offsets))`: an int4 head whose blocks
    carry an offset (GGUF Q4_1 / K-quant mins, tools/gguf_exact.py). The block sums are a
    `Reshape(x, [0, 0, blocks, block])` and a `ReduceSum` over the last axis: row-wise."""
    for y, extra in (add.node.inputs, add.node.inputs[::-1]):
        matmul, corr = head(y), producer.get(extra)
        if matmul is None or corr is None or corr.node.op_type != "MatMul" \
                or corr.node.inputs[1] in dynamic:
            continue
        x = matmul.node.inputs[0]
        sums = producer.get(corr.node.inputs[0])
        if sums is None or sums.node.op_type != "ReduceSum" or len(sums.node.inputs) < 2 \
                or graph.ints.get(sums.node.inputs[1]) not in ([-1], [3]):
            continue
        blocks = producer.get(sums.node.inputs[0])
        if blocks is None or blocks.node.op_type != "Reshape" or blocks.node.inputs[0] != x:
            continue
        shape = graph.ints.get(blocks.node.inputs[1], [])
        if len(shape) != 4 or shape[:2] != [0, 0]:
            continue
        if all(only_reader(t) for t in (y, extra, corr.node.inputs[0], sums.node.inputs[0])):
            return x, [matmul, blocks]
    return None


def _parse(data: bytes) -> tuple[memoryview, _Graph] | None:
    """The model's bytes and its graph, or None for a graph too large to copy or bytes
    that are not a model (a pass then leaves the model alone)."""
    if len(data) > MAX_GRAPH_BYTES:
        return None
    view = memoryview(data)
    try:
        return view, _read_graph(view)
    except ScanError:
        return None


def keep_last_logits(data: bytes, logits: str) -> bytes | None:
    """`data` (an ONNX model) with a `logits_to_keep` input, or None when it does not apply."""
    parsed = _parse(data)
    if parsed is None:
        return None
    view, graph = parsed
    shape = graph.outputs.get(logits)
    if shape is None or len(shape) != 3 or shape[1] == 1 or LOGITS_TO_KEEP in graph.inputs:
        return None
    if any(LOGITS_TO_KEEP in g.node.inputs or LOGITS_TO_KEEP in g.node.outputs
           for g in graph.nodes):
        return None
    found = _find_head(graph, logits)
    if found is None:
        return None
    hidden, readers = found
    starts, kept = f"{_PREFIX}/starts", f"{_PREFIX}/hidden"
    added = [
        proto.node("Neg", [LOGITS_TO_KEEP], [starts], name=f"{_PREFIX}/Neg"),
        proto.node("Slice", [hidden, starts, f"{_PREFIX}/ends", f"{_PREFIX}/axes"], [kept],
                   name=f"{_PREFIX}/Slice"),
    ]
    constants = [proto.tensor(f"{_PREFIX}/ends", np.array([np.iinfo(np.int64).max])),
                 proto.tensor(f"{_PREFIX}/axes", np.array([-2], dtype=np.int64))]
    readers.sort(key=lambda g: g.start)
    g0, g1 = graph.span
    out = bytearray(view[g0:readers[0].start])
    out += b"".join(proto._bytes(1, n) for n in added)  # before the first reader
    for i, g in enumerate(readers):
        out += proto._bytes(1, _rename_first_input(view, g, kept))
        out += view[g.end:readers[i + 1].start if i + 1 < len(readers) else g1]
    out += b"".join(proto._bytes(5, t) for t in constants)
    out += proto._bytes(11, proto.value_info(LOGITS_TO_KEEP, proto.INT64, [1]))
    return _with_graph(view, bytes(out))


def _with_graph(view: memoryview, graph: bytes, extra: bytes = b"") -> bytes:
    """The model: every field as it was, the graph's with its new bytes, then `extra`
    (more model fields)."""
    model = bytearray()
    r = _Reader(view)
    for number, wire, _ in r.fields():
        model += proto._bytes(7, graph) if (number, wire) == (7, 2) \
            else view[r.field_start:r.pos]
    return bytes(model + extra)


def _rename_first_input(view: memoryview, g: _GraphNode, name: str) -> bytes:
    r = _Reader(view, g.start, g.end)
    r.varint()  # the node field's key
    length = r.varint()
    body = _Reader(view, r.pos, r.pos + length)
    out = bytearray()
    renamed = False
    for number, wire, _ in body.fields():
        start = body.field_start
        if number == 1 and wire == 2 and not renamed:
            out += proto._str(1, name)
            renamed = True
        else:
            out += view[start:body.pos]
    return bytes(out)


#: The operator domain of the engine's own kernels (engine/kernels).
KERNEL_DOMAIN = "engine.kernels"
#: GroupQueryAttention attributes the engine's kernel reads; a node with any other (a
#: softcap's `qk_output`, a custom `mask_filter_value`...) keeps ONNX Runtime's kernel.
_GQA_ATTRIBUTES = frozenset({"num_heads", "kv_num_heads", "scale", "local_window_size",
                             "softcap", "do_rotary", "rotary_interleaved", "smooth_softmax"})
#: Inputs and outputs it takes: query ... sin_cache; output, present key and value.
_GQA_INPUTS, _GQA_OUTPUTS = 9, 3


def own_attention(data: bytes) -> bytes | None:
    """`data` with its float GroupQueryAttention nodes moved to the engine's kernel
    (engine/kernels/decode_attention.c: the same inputs, outputs and attributes; its own
    decode step, ONNX Runtime's kernel for everything else), or None when no node
    qualifies. The caller registers the kernel's library with the session."""
    return own_attention_moves(data)[0]


def own_attention_moves(data: bytes) -> tuple[bytes | None, int, Counter[str]]:
    """`own_attention`, with the graph's GroupQueryAttention node count and why the nodes
    not moved keep ONNX Runtime's kernel (a reason each, counted)."""
    kept: Counter[str] = Counter()
    parsed = _parse(data)
    if parsed is None:
        kept["the graph could not be read"] += 1
        return None, 0, kept
    view, graph = parsed
    g0, g1 = graph.span
    out = bytearray()
    pos = g0
    nodes = moved = 0
    for g in graph.nodes:
        if g.node.op_type != "GroupQueryAttention":
            continue
        nodes += 1
        node = _own_attention_node(view, g, graph.inputs)
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
    opset = proto._bytes(8, proto._str(1, KERNEL_DOMAIN) + proto._int(2, 1))
    return _with_graph(view, bytes(out), opset), nodes, kept


@dataclass
class _NodeParts:
    """A node's inputs and outputs (trailing empty names dropped), its domain, its
    attributes by name (an integer attribute's value, else None) and `kept`: the bytes of
    every field but those three, as they were."""

    inputs: list[str]
    outputs: list[str]
    domain: str
    attributes: dict[str, int | None]
    kept: bytes

    def unhandled(self, handled: frozenset[str]) -> str | None:
        """Why the engine's kernel cannot take the node: an attribute it does not read."""
        name = next((n for n in self.attributes if n not in handled), None)
        return None if name is None else f"attribute {name or '(unnamed)'} not handled"

    def rebuilt(self, inputs: list[str], outputs: list[str]) -> bytes:
        """The node with these inputs and outputs, in the engine's kernel domain."""
        node = bytearray()
        node += b"".join(proto._str(1, i) for i in inputs)
        node += b"".join(proto._str(2, o) for o in outputs)
        node += self.kept
        node += proto._str(7, KERNEL_DOMAIN)
        return bytes(node)


def _node_parts(view: memoryview, g: _GraphNode) -> _NodeParts:
    r = _Reader(view, g.start, g.end)
    r.varint()  # the node field's key
    length = r.varint()
    body = _Reader(view, r.pos, r.pos + length)
    inputs: list[str] = []
    outputs: list[str] = []
    domain = ""
    attributes: dict[str, int | None] = {}
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
                attributes[name] = integer
            kept += raw
    while inputs and not inputs[-1]:
        inputs.pop()
    while outputs and not outputs[-1]:
        outputs.pop()
    return _NodeParts(inputs, outputs, domain, attributes, bytes(kept))


def _own_attention_node(view: memoryview, g: _GraphNode, input_types: dict[str, int]
                        ) -> bytes | str:
    """The node for the engine's kernel, or why it keeps ONNX Runtime's."""
    parts = _node_parts(view, g)
    inputs, outputs, domain = parts.inputs, parts.outputs, parts.domain
    why = parts.unhandled(_GQA_ATTRIBUTES)
    if why is not None:
        return why
    if domain != "com.microsoft":
        return f"operator of domain {domain or 'ai.onnx'}"
    if len(inputs) > _GQA_INPUTS or len(outputs) > _GQA_OUTPUTS:
        return "inputs or outputs not handled (position ids, attention bias...)"
    # float caches only: the kernel is registered for float (an fp16 graph keeps ORT's)
    cache = input_types.get(inputs[3]) if len(inputs) >= 4 else None
    if cache == proto.FLOAT16:
        return "fp16 KV cache"
    if cache != proto.FLOAT:
        return "KV cache not a float32 graph input"
    return parts.rebuilt(inputs, outputs)
