"""The few ONNX protobuf messages a model file needs, encoded without the ``onnx`` package.

The packaged app leaves ``onnx`` out (installer/bundle_config.py: it reads graphs with
``engine.model.onnx_scan``), so GGUF import writes ``model.onnx`` itself. Field numbers are those
of ``onnx.proto`` (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto,
ValueInfoProto, TypeProto, TensorShapeProto, OperatorSetIdProto, StringStringEntryProto);
repeated scalars are written unpacked, which every protobuf parser reads.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

#: TensorProto.DataType
FLOAT, UINT8, INT8, INT16, INT32, INT64, FLOAT16, DOUBLE = 1, 2, 3, 5, 6, 7, 10, 11
_DTYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.uint8): UINT8, np.dtype(np.int8): INT8,
           np.dtype(np.int16): INT16,
           np.dtype(np.int32): INT32, np.dtype(np.int64): INT64,
           np.dtype(np.float16): FLOAT16, np.dtype(np.float64): DOUBLE}
#: AttributeProto.AttributeType
_A_FLOAT, _A_INT, _A_STRING, _A_FLOATS, _A_INTS = 1, 2, 3, 6, 7


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: two's complement, ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(int(value))


def _bytes(field: int, value: bytes) -> bytes:
    return _key(field, 2) + _varint(len(value)) + value


def _str(field: int, value: str) -> bytes:
    return _bytes(field, value.encode("utf-8"))


def _float(field: int, value: float) -> bytes:
    return _key(field, 5) + struct.pack("<f", value)


def dtype_of(array: np.ndarray) -> int:
    try:
        return _DTYPES[array.dtype]
    except KeyError:
        raise ValueError(f"no ONNX type for numpy {array.dtype}") from None


def tensor(name: str, array: np.ndarray) -> bytes:
    """A TensorProto holding ``array`` (little-endian raw data)."""
    array = np.ascontiguousarray(array)
    out = b"".join(_int(1, d) for d in array.shape) + _int(2, dtype_of(array))
    return out + _str(8, name) + _bytes(9, array.astype(array.dtype.newbyteorder("<")).tobytes())


def external_tensor(name: str, dtype: int, shape: Sequence[int], location: str, offset: int,
                    length: int) -> bytes:
    """A TensorProto whose data is ``length`` bytes at ``offset`` of the file ``location``."""
    out = b"".join(_int(1, d) for d in shape) + _int(2, dtype) + _str(8, name)
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        out += _bytes(13, _str(1, key) + _str(2, value))
    return out + _int(14, 1)  # data_location = EXTERNAL


def _attribute(name: str, value: Any) -> bytes:
    out = _str(1, name)
    if isinstance(value, (int, np.integer)):
        return out + _int(3, int(value)) + _int(20, _A_INT)
    if isinstance(value, (float, np.floating)):
        return out + _float(2, float(value)) + _int(20, _A_FLOAT)
    if isinstance(value, str):
        return out + _bytes(4, value.encode()) + _int(20, _A_STRING)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return out + b"".join(_int(8, v) for v in value) + _int(20, _A_INTS)
    if isinstance(value, (list, tuple)):
        return out + b"".join(_float(7, float(v)) for v in value) + _int(20, _A_FLOATS)
    raise ValueError(f"attribute {name}: unsupported value {value!r}")


def node(op_type: str, inputs: Iterable[str], outputs: Iterable[str], name: str,
         domain: str = "", **attrs: Any) -> bytes:
    out = b"".join(_str(1, i) for i in inputs) + b"".join(_str(2, o) for o in outputs)
    out += _str(3, name) + _str(4, op_type)
    out += b"".join(_bytes(5, _attribute(k, v)) for k, v in sorted(attrs.items()))
    return out + (_str(7, domain) if domain else b"")


def value_info(name: str, elem_type: int, shape: Sequence[int | str]) -> bytes:
    dims = b"".join(_bytes(1, _str(2, d) if isinstance(d, str) else _int(1, d)) for d in shape)
    tensor_type = _int(1, elem_type) + _bytes(2, dims)
    return _str(1, name) + _bytes(2, _bytes(1, tensor_type))


def model(nodes: Sequence[bytes], name: str, inputs: Sequence[bytes], outputs: Sequence[bytes],
          initializers: Sequence[bytes], opsets: Sequence[tuple[str, int]], ir_version: int,
          producer: str) -> bytes:
    graph = b"".join(_bytes(1, n) for n in nodes) + _str(2, name)
    graph += b"".join(_bytes(5, t) for t in initializers)
    graph += b"".join(_bytes(11, v) for v in inputs) + b"".join(_bytes(12, v) for v in outputs)
    out = _int(1, ir_version) + _str(2, producer) + _bytes(7, graph)
    for domain, version in opsets:
        out += _bytes(8, (_str(1, domain) if domain else b"") + _int(2, version))
    return out
