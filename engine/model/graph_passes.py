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
    inputs: set[str] = field(default_factory=set)
    outputs: dict[str, list[int | str | None]] = field(default_factory=dict)
    initializers: set[str] = field(default_factory=set)


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
            name = next((r.text(v) for n, w, v in r.sub(value).fields() if n == 8 and w == 2),
                        "")
            graph.initializers.add(name)
        elif number in (11, 12):
            info = _scan_value_info(r.sub(value))
            if number == 11:
                graph.inputs.add(info.name)
            else:
                graph.outputs[info.name] = info.shape
    return graph


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


def _find_head(graph: _Graph, logits: str) -> _GraphNode | None:
    """The node whose first input may be sliced so `logits` keeps the last rows only."""
    producer = {o: g for g in graph.nodes for o in g.node.outputs if o}
    consumers: dict[str, int] = {}
    for g in graph.nodes:
        for i in g.node.inputs:
            consumers[i] = consumers.get(i, 0) + 1
    dynamic = _dynamic(graph)
    tensor = logits
    while True:
        found = producer.get(tensor)
        if found is None:
            return None
        g = found
        moving = [i for i in g.node.inputs if i in dynamic]
        if g.node.op_type in _HEADS:
            return g if moving == g.node.inputs[:1] and len(moving) == 1 else None
        if g.node.op_type not in _POSITIONWISE or len(moving) != 1:
            return None
        tensor = moving[0]  # the row-wise op's other inputs are constants (broadcast)
        if consumers.get(tensor, 0) != 1 or tensor in graph.outputs:
            return None  # someone else reads the unsliced tensor


def keep_last_logits(data: bytes, logits: str) -> bytes | None:
    """`data` (an ONNX model) with a `logits_to_keep` input, or None when it does not apply."""
    if len(data) > MAX_GRAPH_BYTES:
        return None
    view = memoryview(data)
    try:
        graph = _read_graph(view)
    except ScanError:
        return None
    shape = graph.outputs.get(logits)
    if shape is None or len(shape) != 3 or shape[1] == 1 or LOGITS_TO_KEEP in graph.inputs:
        return None
    if any(LOGITS_TO_KEEP in g.node.inputs or g.node.outputs[:1] == [LOGITS_TO_KEEP]
           for g in graph.nodes):
        return None
    head = _find_head(graph, logits)
    if head is None:
        return None
    hidden = head.node.inputs[0]
    starts, kept = f"{_PREFIX}/starts", f"{_PREFIX}/hidden"
    added = [
        proto.node("Neg", [LOGITS_TO_KEEP], [starts], name=f"{_PREFIX}/Neg"),
        proto.node("Slice", [hidden, starts, f"{_PREFIX}/ends", f"{_PREFIX}/axes"], [kept],
                   name=f"{_PREFIX}/Slice"),
    ]
    constants = [proto.tensor(f"{_PREFIX}/ends", np.array([np.iinfo(np.int64).max])),
                 proto.tensor(f"{_PREFIX}/axes", np.array([-2], dtype=np.int64))]
    g0, g1 = graph.span
    out = bytearray(view[g0:head.start])
    out += b"".join(proto._bytes(1, n) for n in added)
    out += proto._bytes(1, _rename_first_input(view, head, kept))
    out += view[head.end:g1]
    out += b"".join(proto._bytes(5, t) for t in constants)
    out += proto._bytes(11, proto.value_info(LOGITS_TO_KEEP, proto.INT64, [1]))
    # the model: every field as it was, the graph's with its new bytes
    model = bytearray()
    r = _Reader(view)
    for number, wire, _ in r.fields():
        model += proto._bytes(7, bytes(out)) if (number, wire) == (7, 2) \
            else view[r.field_start:r.pos]
    return bytes(model)


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
