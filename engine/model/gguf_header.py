"""The size a GGUF file must have, read from its header alone.

A GGUF's header lists every tensor with its type, shape and offset in the data section, so
the header says how long the whole file must be. Reading only the header (a few MB even
for a large vocabulary: its strings are skipped, not decoded) refuses a truncated download
at once; the ``gguf`` package's reader would first build its tables for the whole file and
fail later, slowly, on the first tensor past the end.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import ModelLoadError

_DEFAULT_ALIGNMENT = 32
#: value type id -> size in bytes, for the fixed-size GGUF value types
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4


@dataclass(frozen=True)
class GGUFLayout:
    """What the header says of the file: its tensors' count, where their data starts, and
    the bytes the file must hold (None: a tensor type this check does not know)."""

    tensors: int
    data_offset: int
    required_bytes: int | None
    file_bytes: int


class _HeaderEnds(Exception):
    pass


class _Cursor:
    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf, self.pos, self.order = buf, 0, order

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _HeaderEnds
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += size
        return int(value)

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _HeaderEnds
        self.pos += n

    def string(self) -> bytes:
        n = self.take("Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos])

    def skip_value(self, vtype: int) -> None:
        if vtype in _FIXED:
            self.skip(_FIXED[vtype])
        elif vtype == _STRING:
            self.skip(self.take("Q"))
        elif vtype == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in _FIXED:
                self.skip(_FIXED[item] * count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown metadata value type {vtype}")


def _tensor_bytes(type_id: int, dims: list[int]) -> int | None:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None
    count = 1
    for d in dims:
        count *= d
    return count // block * size


def read_layout(path: Path) -> GGUFLayout:
    """The header's account of ``path`` (ModelLoadError if the header itself is cut or
    damaged)."""
    file_bytes = path.stat().st_size
    if file_bytes < 24:
        raise ModelLoadError(f"{path} is truncated: {file_bytes} bytes, less than a GGUF "
                             "header", hint="download the file again")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        (version,) = struct.unpack_from("<I", buf, 4)
        order = "<" if version & 0xFFFF else ">"  # a big-endian file's version reads swapped
        cur = _Cursor(buf, order)
        try:
            cur.skip(8)
            tensors, kvs = cur.take("Q"), cur.take("Q")
            alignment = _DEFAULT_ALIGNMENT
            for _ in range(kvs):
                key = cur.string()
                vtype = cur.take("I")
                if key == b"general.alignment" and vtype == _UINT32:
                    alignment = cur.take("I")
                else:
                    cur.skip_value(vtype)
            end: int | None = 0
            for _ in range(tensors):
                cur.skip(cur.take("Q"))  # the name
                dims = [cur.take("Q") for _ in range(cur.take("I"))]
                n = _tensor_bytes(cur.take("I"), dims)
                offset = cur.take("Q")
                if end is not None:
                    end = None if n is None else max(end, offset + n)
        except _HeaderEnds:
            raise ModelLoadError(
                f"{path} is truncated: it ends at byte {file_bytes:,}, inside its own header "
                "(the list of its metadata and tensors)",
                hint="download the file again; a complete GGUF holds every tensor it lists"
            ) from None
        except ValueError as exc:
            raise ModelLoadError(f"{path} is damaged: {exc}", hint="download the file again"
                                 ) from None
    if alignment <= 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"{path} is damaged: general.alignment is {alignment}, not a "
                             "power of two", hint="download the file again")
    data_offset = -(-cur.pos // alignment) * alignment
    required = None if end is None else data_offset + end
    return GGUFLayout(tensors, data_offset, required, file_bytes)


def check_complete(path: Path) -> GGUFLayout:
    """:func:`read_layout`, and a ModelLoadError naming the expected and actual sizes when
    the file is shorter than its header says."""
    layout = read_layout(path)
    need = layout.required_bytes
    if need is not None and layout.file_bytes < need:
        have = layout.file_bytes
        raise ModelLoadError(
            f"{path} is truncated: its header lists {layout.tensors} tensors that need "
            f"{need:,} bytes, the file has {have:,} ({have / need:.0%}); "
            f"{need - have:,} bytes are missing",
            hint="download the file again: an interrupted download leaves a file like this")
    return layout
