"""Read an ONNX file's structure straight from its protobuf bytes, without the weights.

The `onnx` package parses the whole file into Python objects (inline weights included) and
costs ~28 MiB of resident memory just to import; the engine only needs the graph's inputs,
outputs, node types, opsets and where the initializers live. This scanner walks the
protobuf wire format over a memory map and skips tensor payloads by their length, so a
multi-gigabyte file with inline weights is scanned without being read into memory.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

# ONNX TensorProto.DataType -> numpy dtype name
ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
              7: "int64", 9: "bool", 10: "float16", 11: "float64", 12: "uint32",
              13: "uint64", 16: "bfloat16"}


class ScanError(ValueError):
    """The bytes are not a well-formed ONNX protobuf (truncated or not ONNX)."""


@dataclass
class ValueInfo:
    name: str = ""
    elem_type: int = 0
    shape: list[int | str | None] = field(default_factory=list)

    @property
    def dtype(self) -> str:
        return ELEM_TYPES.get(self.elem_type, f"onnx-type-{self.elem_type}")


@dataclass
class Initializer:
    name: str = ""
    external: dict[str, str] = field(default_factory=dict)
    data_location: int = 0
    #: Bytes of the serialized tensor (inline payload included).
    size: int = 0
    dims: list[int] = field(default_factory=list)
    #: ONNX TensorProto.DataType of the values.
    data_type: int = 0
    #: Where inline values lie in the file: (start, end) of raw_data, else None.
    raw: tuple[int, int] | None = None


#: Nodes kept whole (inputs, outputs, integer attributes): what the attention's shape is
#: read from (engine.model_dir checks it against the model's metadata).
DETAILED_OPS = frozenset({"GroupQueryAttention", "MatMul", "MatMulNBits", "RotaryEmbedding"})


@dataclass
class Node:
    op_type: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    #: Integer attributes by name.
    ints: dict[str, int] = field(default_factory=dict)


@dataclass
class ScannedModel:
    opsets: dict[str, int] = field(default_factory=dict)
    op_types: list[str] = field(default_factory=list)
    initializers: list[Initializer] = field(default_factory=list)
    inputs: list[ValueInfo] = field(default_factory=list)
    outputs: list[ValueInfo] = field(default_factory=list)
    #: The top-level graph's nodes of DETAILED_OPS types, in graph order.
    nodes: list[Node] = field(default_factory=list)


class _Reader:
    def __init__(self, buf: memoryview, start: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = start
        self.end = len(buf) if end is None else end
        #: Where the field `fields()` last yielded starts (its key), for byte-level edits.
        self.field_start = start

    def varint(self) -> int:
        result = shift = 0
        while True:
            if self.pos >= self.end:
                raise ScanError("truncated varint")
            byte = self.buf[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise ScanError("malformed varint")

    def fields(self):  # type: ignore[no-untyped-def]
        """Yield (field number, wire type, value or (start, end) for length-delimited)."""
        while self.pos < self.end:
            self.field_start = self.pos
            key = self.varint()
            number, wire = key >> 3, key & 7
            if wire == 0:
                yield number, wire, self.varint()
            elif wire == 2:
                length = self.varint()
                start, self.pos = self.pos, self.pos + length
                if self.pos > self.end:
                    raise ScanError(f"field {number} runs past the end of the file")
                yield number, wire, (start, self.pos)
            elif wire in (1, 5):
                self.pos += 8 if wire == 1 else 4
                if self.pos > self.end:
                    raise ScanError("truncated fixed-width field")
                yield number, wire, None
            else:
                raise ScanError(f"unsupported wire type {wire} (not an ONNX file?)")

    def sub(self, span: tuple[int, int]) -> _Reader:
        return _Reader(self.buf, span[0], span[1])

    def text(self, span: tuple[int, int]) -> str:
        return bytes(self.buf[span[0]:span[1]]).decode("utf-8", errors="replace")


def scan_onnx(path: Path) -> ScannedModel:
    """Scan an ONNX model file; raises ScanError when it is malformed or truncated."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ScanError("the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _scan_model(_Reader(view))
            finally:
                view.release()


def _scan_model(r: _Reader) -> ScannedModel:
    model = ScannedModel()
    saw_graph = False
    for number, wire, value in r.fields():
        if number == 8 and wire == 2:  # opset_import
            domain, version = "", 0
            for n, w, v in r.sub(value).fields():
                if n == 1 and w == 2:
                    domain = r.text(v)
                elif n == 2 and w == 0:
                    version = v
            model.opsets[domain or "ai.onnx"] = version
        elif number == 7 and wire == 2:  # graph
            saw_graph = True
            _scan_graph(r.sub(value), model)
    if not saw_graph:
        raise ScanError("no graph found")
    return model


def _scan_graph(r: _Reader, model: ScannedModel) -> None:
    for number, wire, value in r.fields():
        if wire != 2:
            continue
        if number == 1:  # node
            node = _scan_node(r, value)
            model.op_types.append(node.op_type)
            if node.op_type in DETAILED_OPS:
                model.nodes.append(node)
        elif number == 5:  # initializer
            model.initializers.append(_scan_tensor(r, value))
        elif number in (11, 12):  # input, output
            info = _scan_value_info(r.sub(value))
            (model.inputs if number == 11 else model.outputs).append(info)


def _signed(value: int) -> int:
    """A varint read as the int64 it encodes (negative numbers take ten bytes)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _scan_node(r: _Reader, span: tuple[int, int]) -> Node:
    node = Node()
    for n, w, v in r.sub(span).fields():
        if w != 2:
            continue
        if n == 1:
            node.inputs.append(r.text(v))
        elif n == 2:
            node.outputs.append(r.text(v))
        elif n == 4:
            node.op_type = r.text(v)
        elif n == 5:  # attribute: name (1), i (3)
            name, value = "", None
            for an, aw, av in r.sub(v).fields():
                if an == 1 and aw == 2:
                    name = r.text(av)
                elif an == 3 and aw == 0:
                    value = _signed(av)
            if value is not None:
                node.ints[name] = value
    return node


def _scan_tensor(r: _Reader, span: tuple[int, int]) -> Initializer:
    tensor = Initializer(size=span[1] - span[0])
    sub = r.sub(span)
    for n, w, v in sub.fields():
        if n == 1 and w == 0:  # dims, unpacked
            tensor.dims.append(_signed(v))
        elif n == 1 and w == 2:  # dims, packed
            packed = r.sub(v)
            while packed.pos < packed.end:
                tensor.dims.append(_signed(packed.varint()))
        elif n == 2 and w == 0:
            tensor.data_type = v
        elif n == 9 and w == 2:
            tensor.raw = v
        elif n == 8 and w == 2:
            tensor.name = r.text(v)
        elif n == 14 and w == 0:
            tensor.data_location = v
        elif n == 13 and w == 2:
            key = val = ""
            for kn, kw, kv in r.sub(v).fields():
                if kn == 1 and kw == 2:
                    key = r.text(kv)
                elif kn == 2 and kw == 2:
                    val = r.text(kv)
            tensor.external[key] = val
    return tensor


def _scan_value_info(r: _Reader) -> ValueInfo:
    info = ValueInfo()
    for n, w, v in r.fields():
        if n == 1 and w == 2:
            info.name = r.text(v)
        elif n == 2 and w == 2:  # TypeProto
            for tn, tw, tv in r.sub(v).fields():
                if tn == 1 and tw == 2:  # tensor_type
                    _scan_tensor_type(r.sub(tv), info)
    return info


def _scan_tensor_type(r: _Reader, info: ValueInfo) -> None:
    for n, w, v in r.fields():
        if n == 1 and w == 0:
            info.elem_type = v
        elif n == 2 and w == 2:  # shape
            for dn, dw, dv in r.sub(v).fields():
                if dn == 1 and dw == 2:
                    dim: int | str | None = None
                    for en, ew, ev in r.sub(dv).fields():
                        if en == 1 and ew == 0:
                            dim = ev
                        elif en == 2 and ew == 2:
                            dim = r.text(ev) or None
                    info.shape.append(dim)
