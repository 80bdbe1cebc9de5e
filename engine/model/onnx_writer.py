"""A small ONNX graph writer that streams its weights to ``model.onnx.data`` as they come.

Each initializer of 1 KiB or more is appended to the external data file the moment it is
added (aligned to 4 KiB, as ORT maps it) and only its location stays in memory, so writing a
model needs about one tensor's worth of RAM at a time. The protobuf is encoded by
:mod:`engine.model.onnx_proto` (the packaged app has no ``onnx`` package).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import numpy as np

from engine.model import onnx_proto

MS_DOMAIN = "com.microsoft"
OPSET = 21
IR_VERSION = 10
_EXTERNAL_MIN_BYTES = 1024
_ALIGN = 4096


class OnnxWriter:
    """Nodes and initializers of one graph; weights go to the data file as they are added."""

    def __init__(self, model_path: Path, name: str = "main_graph") -> None:
        self.model_path = Path(model_path)
        self.data_name = self.model_path.name + ".data"
        self._data: IO[bytes] = open(self.model_path.parent / self.data_name, "wb")  # noqa: SIM115
        self._offset = 0
        self.name = name
        self.nodes: list[bytes] = []
        self.initializers: list[bytes] = []
        self._names: set[str] = set()
        self._counter = 0
        self.bytes_written = 0

    # -- initializers ----------------------------------------------------------------------
    def init(self, name: str, array: np.ndarray) -> str:
        """Add a constant; large ones are written to the data file now."""
        if name in self._names:
            raise ValueError(f"initializer {name!r} added twice")
        self._names.add(name)
        array = np.ascontiguousarray(array)
        if array.nbytes < _EXTERNAL_MIN_BYTES:
            self.initializers.append(onnx_proto.tensor(name, array))
            return name
        pad = -self._offset % _ALIGN
        if pad:
            self._data.write(b"\0" * pad)
            self._offset += pad
        self._data.write(array.tobytes())
        self.initializers.append(onnx_proto.external_tensor(
            name, onnx_proto.dtype_of(array), array.shape, self.data_name, self._offset,
            array.nbytes))
        self._offset += array.nbytes
        self.bytes_written += array.nbytes
        return name

    def const(self, values: Any, dtype: type = np.int64) -> str:
        """A small constant, named by its value (shared by every node that uses it)."""
        array: np.ndarray = np.array(values, dtype)
        name = f"/const/{np.dtype(dtype).name}/{array.tolist()}"
        if name not in self._names:
            self.init(name, array)
        return name

    # -- nodes -----------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str, name: str | None = None, out: str | None = None,
           domain: str = "", **attrs: Any) -> str:
        """One node with one output; returns the output's name."""
        return self.ops(op_type, list(inputs), [out] if out else 1, name=name, domain=domain,
                        **attrs)[0]

    def ops(self, op_type: str, inputs: list[str], outputs: list[str] | int, *,
            name: str | None = None, domain: str = "", **attrs: Any) -> list[str]:
        self._counter += 1
        node_name = name or f"/{op_type}_{self._counter}"
        if isinstance(outputs, int):
            outputs = [f"{node_name}/output_{i}" for i in range(outputs)]
        self.nodes.append(onnx_proto.node(op_type, inputs, outputs, node_name, domain, **attrs))
        return outputs

    # -- the file --------------------------------------------------------------------------
    def save(self, inputs: list[bytes], outputs: list[bytes]) -> None:
        """Close the data file and write ``model.onnx`` (graph and small constants)."""
        self._data.close()
        self.model_path.write_bytes(onnx_proto.model(
            self.nodes, self.name, inputs, outputs, self.initializers,
            [("", OPSET), (MS_DOMAIN, 1)], IR_VERSION, "onnx-local-llm import-gguf"))

    def abandon(self) -> None:
        self._data.close()


def tensor_info(name: str, elem: int, shape: list[int | str]) -> bytes:
    return onnx_proto.value_info(name, elem, shape)
