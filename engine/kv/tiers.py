"""The engine's side of the tiered KV store: keys, fetching into a runner, storing from it.

Chunk `i` of a sequence is stored under the key of its whole token prefix, so a later
request (or another process after a restart) that shares whole chunks fetches them and
skips their prefill. Best effort: any store failure only means recomputation.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from engine.config import KVStoreConfig
from engine.kv.store import KVStore, chunk_keys
from engine.model.kv16_pass import I8_SCALE_BYTES
from engine.model.model_dir import ModelDir
from engine.runtime.runner import DecodeRunner

log = logging.getLogger(__name__)


def model_identity(model: ModelDir, provider: str, kv_dtype: str) -> str:
    """Identity of the KV a model produces: files (size, mtime), provider and KV dtype.

    KV from another provider is not bit-identical, so it gets another identity; int8 rows
    name their scale's format (a bfloat16 since the rows shrank from head_size + 4 bytes:
    chunks stored with float32 scales belong to another identity, never misread).
    """
    if kv_dtype == "int8":
        kv_dtype = f"int8+{I8_SCALE_BYTES}"
    digest = hashlib.blake2b(digest_size=12)
    files = [model.model_file, *(e.path for e in model.graph.external_data)]
    for name in ("genai_config.json", "config.json", "inference_metadata.yaml"):
        files.append(model.path / name)
    for path in files:
        if path.is_file():
            st = path.stat()
            digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return f"{model.name}@{provider}:{kv_dtype}:{digest.hexdigest()}"


class KVTiers:
    def __init__(self, config: KVStoreConfig, model_id: str, *, on_gpu: bool) -> None:
        quantize = on_gpu if config.quantize is None else config.quantize
        self.chunk = config.chunk_tokens
        self.model_id = model_id
        self.store = KVStore(model_id, chunk_tokens=config.chunk_tokens,
                             ram_bytes=config.ram_bytes, disk_bytes=config.disk_bytes,
                             disk_dir=Path(config.disk_dir) if config.disk_dir else None,
                             quantize=quantize)

    def available(self, prompt: list[int], limit: int) -> list[str]:
        """Keys of the leading chunks of `prompt` (within `limit` tokens) the store holds."""
        keys = chunk_keys(self.model_id, prompt[: limit - limit % self.chunk], self.chunk)
        found = []
        for key in keys:
            if not self.store.contains(key):
                break
            found.append(key)
        return found

    def fetch_into(self, runner: DecodeRunner, prompt: list[int], keys: list[str],
                   start: int) -> int:
        """Import chunks `start // chunk ..` of `keys` at `start`; return the tokens held."""
        assert start % self.chunk == 0
        at = start
        for key in keys[start // self.chunk:]:
            rows = self.store.get(key)  # None: evicted or corrupt since `available`
            if rows is None:
                break
            runner.import_kv(rows, at, prompt[at:at + self.chunk])
            at += self.chunk
        return at

    def save_from(self, runner: DecodeRunner, held: list[int]) -> None:
        """Store the complete chunks of `held` (the runner's tokens) not stored yet."""
        for index, key in enumerate(chunk_keys(self.model_id, held, self.chunk)):
            if not self.store.contains(key):
                start = index * self.chunk
                self.store.put(key, runner.export_kv(start, start + self.chunk))

    def close(self) -> None:
        self.store.close()
