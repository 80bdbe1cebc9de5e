"""Tiered KV store: content-addressed KV chunks in a RAM tier over a disk tier.

A chunk is the KV of ``chunk_tokens`` consecutive tokens for every KV pair: one
``[heads, chunk_tokens, head_dim]`` float32/float16 array per pair (geometry may differ per
pair). Chunk ``i`` of a sequence lives under ``chunk_key(model_id, tokens[:(i + 1) *
chunk_tokens])``, so equal keys mean identical prefixes and identical KV.

- RAM tier: LRU capped at ``ram_bytes``; disk hits are promoted into it, and entries pushed
  out are demoted (written to disk when the disk holds no copy).
- Disk tier: write-through (a kill keeps what ``put`` stored), LRU by last access (RAM
  hits included) kept in file mtimes so it survives restarts, capped at ``disk_bytes``. One
  ``<key>.kvc`` file per chunk, written to a temp file and ``os.replace``d. No fsync: every
  read checks magic, sizes, model id, key and a blake2b checksum: a torn write is a miss.
  The index is rebuilt at start from a directory listing alone.
- Best effort: a corrupt, truncated or foreign file is deleted, counted and missed; an
  unwritable or full cache dir disables the disk tier with one warning and RAM keeps
  serving. Only malformed arguments (a bad key or chunk) raise.
- One lock serializes the public methods (the engine thread writes; ``stats`` may be read
  from another thread). Processes sharing a directory each keep their own index and cap; a
  file another process evicted is a miss, a half-written one is never visible.

File layout (little-endian): preamble ``magic(8) version(u32) header_len(u32)
payload_len(u64) blake2b-256 of header+payload(32)``, a JSON header ``{model_id, key,
chunk_tokens, quantized, arrays: [[dtype, [heads, tokens, head_dim]], ...]}``, then per
array ``scales f32[heads] + data i8[...]`` (quantized) or the raw array bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
import platformdirs

from engine.kv.format import (
    CHUNK_DTYPES,
    CorruptChunk,
    Encoded,
    check_key,
    decode_chunk,
    encode_chunk,
    parse_chunk,
    scan_chunks,
    serialize_chunk,
    write_atomically,
)

__all__ = ["KVStore", "KVStoreStats", "chunk_key", "chunk_keys", "default_store_dir"]

log = logging.getLogger(__name__)

APP_NAME = "onnx-local-llm"
_COUNTERS = ("ram_hits", "ram_misses", "disk_hits", "disk_misses", "puts", "demotions",
             "promotions", "evictions", "corrupt_dropped", "errors")


def chunk_keys(
    model_id: str, tokens: Sequence[int] | np.ndarray, chunk_tokens: int
) -> list[str]:
    """Keys of every complete chunk of ``tokens``: item ``i`` is
    ``chunk_key(model_id, tokens[:(i + 1) * chunk_tokens])``, computed in one pass."""
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"model_id: expected a non-empty string, got {model_id!r}")
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens: expected a positive integer, got {chunk_tokens}")
    ids = np.asarray(tokens)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(
            f"tokens: expected a flat sequence of integer token ids, got dtype {ids.dtype} "
            f"and shape {ids.shape}"
        )
    raw = ids.astype("<i8").tobytes()
    name = model_id.encode("utf-8")
    hasher = hashlib.blake2b(digest_size=32, person=b"kvchunk-v1")
    hasher.update(struct.pack("<Q", len(name)) + name)
    keys: list[str] = []
    step = chunk_tokens * 8
    for end in range(step, len(raw) + 1, step):
        hasher.update(raw[end - step:end])
        keys.append(hasher.copy().hexdigest())
    return keys


def chunk_key(model_id: str, prefix_tokens: Sequence[int] | np.ndarray) -> str:
    """The key of the chunk that ends ``prefix_tokens``: a blake2b-256 hex digest of the
    model identity and the whole token prefix."""
    if len(prefix_tokens) == 0:
        raise ValueError("prefix_tokens: expected at least one token, got an empty prefix")
    return chunk_keys(model_id, prefix_tokens, len(prefix_tokens))[0]


def default_store_dir(model_id: str) -> Path:
    """``<user cache dir>/kv/<readable model name>-<hash>``: one directory per model."""
    digest = hashlib.blake2b(model_id.encode("utf-8"), digest_size=8).hexdigest()
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)[-40:].strip("._") or "model"
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "kv" / f"{readable}-{digest}"


class KVStoreStats(TypedDict):
    ram_entries: int
    ram_bytes: int
    ram_cap_bytes: int
    ram_hits: int
    ram_misses: int
    disk_entries: int
    disk_bytes: int
    disk_cap_bytes: int
    disk_hits: int
    disk_misses: int
    disk_dir: str | None
    disk_disabled: str | None  # why the disk tier is off; None while it works
    puts: int
    demotions: int
    promotions: int
    evictions: int  # entries that left the store entirely
    corrupt_dropped: int
    errors: int


class KVStore:
    """RAM → disk store of KV chunks for one model (see the module docstring).

    ``ram_bytes``/``disk_bytes`` cap each tier (0 turns a tier off); ``disk_dir`` defaults
    to :func:`default_store_dir`. With ``quantize`` the tiers hold int8 blocks with one
    scale per head (lossy; see ``engine.kv.quant``) and count their bytes.
    """

    def __init__(self, model_id: str, *, chunk_tokens: int, ram_bytes: int, disk_bytes: int,
                 disk_dir: Path | None = None, quantize: bool = True) -> None:
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"model_id: expected a non-empty string, got {model_id!r}")
        for name, value, low in (("chunk_tokens", chunk_tokens, 1), ("ram_bytes", ram_bytes, 0),
                                 ("disk_bytes", disk_bytes, 0)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        self.model_id = model_id
        self.chunk_tokens = chunk_tokens
        self.quantize = quantize
        self._ram_cap, self._disk_cap = ram_bytes, disk_bytes
        self._lock = threading.Lock()
        self._ram: OrderedDict[str, Encoded] = OrderedDict()
        self._ram_used = 0
        self._disk: OrderedDict[str, int] = OrderedDict()  # key -> file bytes, LRU first
        self._disk_used = 0
        self._n = dict.fromkeys(_COUNTERS, 0)
        self._closed = False
        self._warned_ram = False
        self._disabled: str | None = None
        self._dir: Path | None = None
        if disk_bytes == 0:
            self._disabled = "disk_bytes is 0"
        else:
            self._open_disk(disk_dir if disk_dir is not None else default_store_dir(model_id))

    # -- public surface ---------------------------------------------------------------

    def put(self, key: str, chunk: Sequence[np.ndarray]) -> None:
        """Store ``chunk`` under ``key``; a key already stored is only refreshed (equal
        keys hold identical KV). Never raises for storage failures."""
        check_key(key)
        self._check_chunk(chunk)
        with self._lock:
            if self._closed:
                return
            if key in self._ram or key in self._disk:
                self._touch(key)
                return
            try:
                enc = encode_chunk(chunk, self.quantize)
            except ValueError as exc:  # NaN/inf KV: not worth keeping, not worth failing
                self._n["errors"] += 1
                log.debug("KV store: chunk %s not stored: %s", key[:12], exc)
                return
            self._n["puts"] += 1
            self._write_disk(key, enc)
            self._insert_ram(key, enc)

    def get(self, key: str) -> list[np.ndarray] | None:
        """The chunk stored under ``key`` in its original dtypes, or None (a miss)."""
        check_key(key)
        with self._lock:
            if self._closed:
                return None
            enc = self._ram.get(key)
            if enc is not None:
                self._touch(key)  # the disk copy too: hot chunks should survive a restart
                self._n["ram_hits"] += 1
                return decode_chunk(enc)
            self._n["ram_misses"] += 1
            if self._disabled is not None:
                return None
            enc = self._read_disk(key) if key in self._disk else None
            if enc is None:
                self._n["disk_misses"] += 1
                return None
            self._n["disk_hits"] += 1
            self._n["promotions"] += 1
            self._insert_ram(key, enc)
            return decode_chunk(enc)

    def contains(self, key: str) -> bool:
        """Whether some tier indexes ``key`` (a disk file is only validated by ``get``)."""
        check_key(key)
        with self._lock:
            return key in self._ram or key in self._disk

    def stats(self) -> KVStoreStats:
        with self._lock:
            n = self._n
            return KVStoreStats(
                ram_entries=len(self._ram), ram_bytes=self._ram_used, ram_cap_bytes=self._ram_cap,
                ram_hits=n["ram_hits"], ram_misses=n["ram_misses"],
                disk_entries=len(self._disk), disk_bytes=self._disk_used,
                disk_cap_bytes=self._disk_cap, disk_hits=n["disk_hits"],
                disk_misses=n["disk_misses"], disk_dir=str(self._dir) if self._dir else None,
                disk_disabled=self._disabled, puts=n["puts"], demotions=n["demotions"],
                promotions=n["promotions"], evictions=n["evictions"],
                corrupt_dropped=n["corrupt_dropped"], errors=n["errors"])

    def close(self) -> None:
        """Release the RAM tier. Disk files stay (they were written through on ``put``)."""
        with self._lock:
            self._closed = True
            self._ram.clear()
            self._ram_used = 0

    # -- validation ---------------------------------------------------------------------

    def _check_chunk(self, chunk: Sequence[np.ndarray]) -> None:
        if not isinstance(chunk, (list, tuple)) or not chunk:
            raise ValueError(
                f"chunk: expected a non-empty list of KV arrays (one per pair), got {chunk!r:.60}"
            )
        for i, a in enumerate(chunk):
            ok = (isinstance(a, np.ndarray) and a.ndim == 3
                  and a.dtype.name in CHUNK_DTYPES
                  and a.shape[1] == self.chunk_tokens)
            if not ok:
                got = f"{a.dtype.name}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a)
                raise ValueError(
                    f"chunk[{i}]: expected a float32/float16/int8/int16 array [heads, "
                    f"{self.chunk_tokens}, head_dim], got {got}; slice the KV to one chunk"
                )

    # -- RAM tier -----------------------------------------------------------------------

    def _insert_ram(self, key: str, enc: Encoded) -> None:
        if enc.nbytes > self._ram_cap:
            if not self._warned_ram and self._ram_cap > 0:
                self._warned_ram = True
                log.warning("KV store: a chunk of %d bytes exceeds ram_bytes=%d; the RAM tier "
                            "holds nothing", enc.nbytes, self._ram_cap)
            return
        while self._ram_used + enc.nbytes > self._ram_cap:
            victim, old = self._ram.popitem(last=False)
            self._ram_used -= old.nbytes
            if victim not in self._disk:
                self._write_disk(victim, old)
            if victim in self._disk:
                self._n["demotions"] += 1
            else:
                self._n["evictions"] += 1
        self._ram[key] = enc
        self._ram_used += enc.nbytes

    def _touch(self, key: str) -> None:
        if key in self._ram:
            self._ram.move_to_end(key)
        if key in self._disk and self._dir is not None:
            self._disk.move_to_end(key)
            with contextlib.suppress(OSError):  # only a restart would see a stale mtime
                os.utime(self._dir / f"{key}.kvc")

    # -- disk tier ----------------------------------------------------------------------

    def _open_disk(self, directory: Path) -> None:
        self._dir = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if not os.access(directory, os.W_OK | os.X_OK):
                raise PermissionError(f"{directory} is not writable")
            found = scan_chunks(directory)
        except OSError as exc:
            self._disable(f"cache dir {directory} unusable: {exc}")
            return
        for _, key, size in sorted(found):
            self._disk[key] = size
            self._disk_used += size
        self._evict_disk(0)

    def _evict_disk(self, incoming: int) -> None:
        while self._disk and self._disk_used + incoming > self._disk_cap:
            victim = next(iter(self._disk))
            self._n["evictions"] += victim not in self._ram
            self._drop_disk(victim)

    def _write_disk(self, key: str, enc: Encoded) -> None:
        if self._disabled is not None or self._dir is None:
            return
        pieces = serialize_chunk(self.model_id, key, self.chunk_tokens, enc)
        size = sum(len(piece) for piece in pieces)
        if size > self._disk_cap:
            self._disable(f"a chunk file of {size} bytes exceeds disk_bytes={self._disk_cap}")
            return
        self._evict_disk(size)
        final = self._dir / f"{key}.kvc"
        try:
            try:
                write_atomically(final, pieces)
            except FileNotFoundError:  # the user emptied the cache dir under us
                self._dir.mkdir(parents=True, exist_ok=True)
                write_atomically(final, pieces)
        except OSError as exc:
            self._n["errors"] += 1
            self._disable(f"cannot write {final}: {exc}")
            return
        self._disk[key] = size
        self._disk_used += size

    def _read_disk(self, key: str) -> Encoded | None:
        assert self._dir is not None
        path = self._dir / f"{key}.kvc"
        try:
            blob = path.read_bytes()
            enc = parse_chunk(blob, self.model_id, key, self.chunk_tokens, self.quantize)
        except CorruptChunk as exc:
            self._n["corrupt_dropped"] += 1
            log.warning("KV store: dropped chunk file %s: %s", path.name, exc)
            self._drop_disk(key)
            return None
        except OSError as exc:  # vanished (another process evicted it) or unreadable
            if not isinstance(exc, FileNotFoundError):
                self._n["errors"] += 1
                log.debug("KV store: cannot read %s: %s", path, exc)
            self._drop_disk(key)
            return None
        self._touch(key)
        return enc

    def _drop_disk(self, key: str) -> None:
        self._disk_used -= self._disk.pop(key, 0)
        if self._dir is None:
            return
        try:
            (self._dir / f"{key}.kvc").unlink(missing_ok=True)
        except OSError as exc:
            log.debug("KV store: cannot delete chunk %s: %s", key[:12], exc)

    def _disable(self, reason: str) -> None:
        if self._disabled is not None:
            return
        self._disabled = reason
        self._disk.clear()
        self._disk_used = 0
        log.warning("KV store: disk tier disabled (%s); continuing with the RAM tier only",
                    reason)
