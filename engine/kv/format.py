"""The on-disk format of KV store chunks, and the tier-independent chunk encoding.

File layout (little-endian): preamble ``magic(8) version(u32) header_len(u32)
payload_len(u64) blake2b-256 of header+payload(32)``, a JSON header ``{model_id, key,
chunk_tokens, quantized, arrays: [[dtype, [heads, tokens, head_dim]], ...]}``, then per
array ``scales f32[heads] + data i8[...]`` (quantized) or the raw array bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.kv.quant import QuantizedKV, dequantize_int8, quantize_int8

MAGIC = b"KVCHUNK\x00"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct("<8sIIQ32s")
FILE_RE = re.compile(r"([0-9a-f]{64})\.kvc")
STALE_TMP_S = 3600.0
#: The element types a chunk's arrays may have; of them, the live cache's own int8 and
#: int16 rows (each with its scale) are written as they are, never re-quantized.
CHUNK_DTYPES = ("float32", "float16", "int8", "int16")
ROW_DTYPES = ("int8", "int16")


@dataclass(frozen=True)
class Encoded:
    """A chunk as the tiers hold it: int8 blocks or raw little-endian copies."""

    parts: tuple[QuantizedKV | np.ndarray, ...]
    nbytes: int


class CorruptChunk(Exception):
    pass


def check_key(key: str) -> None:
    if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{64}", key):
        raise ValueError(f"key: expected a 64-hex-digit chunk_key(...) value, got {key!r}")


def encode_chunk(chunk: Sequence[np.ndarray], quantize: bool) -> Encoded:
    parts: tuple[QuantizedKV | np.ndarray, ...]
    if quantize and chunk[0].dtype.name not in ROW_DTYPES:  # cache rows: as they are
        parts = tuple(quantize_int8(a) for a in chunk)
    else:
        parts = tuple(np.array(a, dtype=a.dtype.newbyteorder("<"), order="C") for a in chunk)
    return Encoded(parts, sum(p.nbytes for p in parts))


def decode_chunk(enc: Encoded) -> list[np.ndarray]:
    return [dequantize_int8(p) if isinstance(p, QuantizedKV) else p.copy() for p in enc.parts]


def serialize_chunk(model_id: str, key: str, chunk_tokens: int, enc: Encoded) -> list[bytes]:
    arrays = [[p.dtype if isinstance(p, QuantizedKV) else p.dtype.name, list(p.shape)]
              for p in enc.parts]
    header = json.dumps({"model_id": model_id, "key": key, "chunk_tokens": chunk_tokens,
                         "quantized": isinstance(enc.parts[0], QuantizedKV),
                         "arrays": arrays}, separators=(",", ":")).encode("utf-8")
    pieces = [header]
    for p in enc.parts:
        if isinstance(p, QuantizedKV):
            pieces += [p.scales.astype("<f4").tobytes(), p.data.tobytes()]
        else:
            pieces.append(p.tobytes())
    hasher = hashlib.blake2b(digest_size=32)
    for piece in pieces:
        hasher.update(piece)
    payload_len = sum(len(piece) for piece in pieces) - len(header)
    preamble = PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header), payload_len, hasher.digest())
    return [preamble, *pieces]


def parse_chunk(
    blob: bytes, model_id: str, key: str, chunk_tokens: int, quantized: bool
) -> Encoded:
    """Decode one chunk file; raises ``CorruptChunk`` saying what is wrong with it."""
    if len(blob) < PREAMBLE.size:
        raise CorruptChunk(f"truncated: {len(blob)} bytes")
    magic, version, header_len, payload_len, digest = PREAMBLE.unpack_from(blob)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise CorruptChunk(f"bad magic/version {magic!r}/{version}")
    if len(blob) != PREAMBLE.size + header_len + payload_len:
        raise CorruptChunk(f"size {len(blob)} != {PREAMBLE.size + header_len + payload_len}")
    body = memoryview(blob)[PREAMBLE.size:]
    if hashlib.blake2b(body, digest_size=32).digest() != digest:
        raise CorruptChunk("checksum mismatch")
    try:
        header = json.loads(bytes(body[:header_len]).decode("utf-8"))
        rows = all(dtype in ROW_DTYPES for dtype, _ in header["arrays"])
        found = (header["model_id"], header["key"], header["chunk_tokens"], header["quantized"])
        if found != (model_id, key, chunk_tokens, quantized and not rows):
            raise CorruptChunk(f"belongs to (model, key, chunk_tokens, quantized)={found}")
        parts: list[QuantizedKV | np.ndarray] = []
        offset = PREAMBLE.size + header_len
        for dtype, shape in header["arrays"]:
            heads, tokens, head_dim = (int(n) for n in shape)
            if dtype not in CHUNK_DTYPES or tokens != chunk_tokens or min(heads, head_dim) < 0:
                raise CorruptChunk(f"unexpected array {dtype}{shape}")
            count = heads * tokens * head_dim
            if quantized and not rows:
                scales = np.frombuffer(blob, "<f4", heads, offset)
                offset += 4 * heads
                data = np.frombuffer(blob, np.int8, count, offset).reshape(shape)
                parts.append(QuantizedKV(data=data, scales=scales, dtype=dtype))
                offset += count
            else:
                item = np.dtype(dtype).newbyteorder("<")
                parts.append(np.frombuffer(blob, item, count, offset).reshape(shape))
                offset += count * item.itemsize
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptChunk(f"bad header: {exc}") from exc
    if offset != len(blob) or not parts:
        raise CorruptChunk("payload does not match the header's arrays")
    return Encoded(tuple(parts), sum(p.nbytes for p in parts))


def write_atomically(final: Path, pieces: list[bytes]) -> None:
    """Readers see the whole file or none: a unique temp file, then ``os.replace``."""
    tmp = final.with_name(f".{final.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def scan_chunks(directory: Path) -> list[tuple[int, str, int]]:
    """(mtime_ns, key, size) of every chunk file; deletes temp files of killed writers."""
    found = []
    now = time.time()
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                st = entry.stat()
                if entry.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                    Path(entry.path).unlink(missing_ok=True)
                elif (match := FILE_RE.fullmatch(entry.name)) is not None:
                    found.append((st.st_mtime_ns, match.group(1), st.st_size))
            except FileNotFoundError:
                continue  # another process evicted it while we listed
    return found
