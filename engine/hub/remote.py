"""What a Hub repository holds, read when the catalog is shown or a model is pulled: its
files and sizes (:func:`engine.hub.download.list_files`), the model's shape from its
``genai_config.json`` / ``config.json``, or from a GGUF file's header (read with a ranged
request: the metadata only, never the weights).

The endpoint is the caller's, else ``$HF_ENDPOINT``, else https://huggingface.co.
"""

from __future__ import annotations

import fnmatch
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from engine.hub.download import DownloadError, DownloadRequest, RemoteFile, list_files

#: Bytes of a GGUF header read at most (a 150k-token vocabulary is about 10 MB).
GGUF_HEADER_LIMIT = 64 * 1024 * 1024
#: GGUF file types this engine imports (others are refused before a download).
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
_QUANT = re.compile(r"(?:^|[-_.])((?:I?Q\d(?:_[0-9A-Z]+)*)|F16|BF16|F32)(?=[-_.]|\.gguf$)",
                    re.IGNORECASE)
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache and the context depend on."""

    layers: int
    kv_heads: int
    head_dim: int
    context: int
    #: 4: float32 KV (CPU exports, GGUF imports); 2: float16. As exported: the engine
    #: keeps float32 KV in 16 bits on the CPU where its kernel applies (hub.fit.engine_kv).
    kv_dtype_bytes: int
    architecture: str = ""
    #: Bytes a KV row holds besides its values (a scale): 2 for the engine's int8 rows and
    #: for its int16 rows.
    kv_row_extra: int = 0

    @property
    def kv_bytes_per_token(self) -> int:
        row = self.head_dim * self.kv_dtype_bytes + self.kv_row_extra
        return 2 * self.layers * self.kv_heads * row


@dataclass(frozen=True)
class Listing:
    request: DownloadRequest
    commit: str
    files: list[RemoteFile]

    def under(self, folder: str) -> list[RemoteFile]:
        prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
        return [f for f in self.files if f.path.startswith(prefix)]


def list_repo(repo_id: str, endpoint: str, subfolder: str = "",
              revision: str = "main") -> Listing:
    request = DownloadRequest(repo_id, subfolder, revision, endpoint)
    commit, files = list_files(request)
    return Listing(request, commit, files)


def _get(repo_id: str, path: str, endpoint: str, commit: str,
         headers: dict[str, str] | None = None) -> Any:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    url = hf_hub_url(repo_id, path, revision=commit, endpoint=endpoint)
    response = http_backoff("GET", url, headers={**build_hf_headers(), **(headers or {})},
                            retry_on_exceptions=(), retry_on_status_codes=(429,))
    hf_raise_for_status(response)
    return response


def read_json(repo_id: str, path: str, endpoint: str, commit: str) -> dict[str, Any]:
    data = json.loads(_get(repo_id, path, endpoint, commit).content)
    if not isinstance(data, dict):
        raise DownloadError(f"{path} of {repo_id} is not a JSON object")
    return data


def onnx_shape(config: dict[str, Any], genai: bool, kv_dtype_bytes: int) -> ModelShape:
    """The shape from onnxruntime-genai's ``genai_config.json`` or a Hugging Face
    ``config.json`` (optimum exports)."""
    if genai:
        model = config.get("model", {})
        dec = model.get("decoder", {})
        layers, kv = dec.get("num_hidden_layers"), dec.get("num_key_value_heads")
        head, ctx = dec.get("head_size"), model.get("context_length")
    else:
        layers = config.get("num_hidden_layers")
        heads = config.get("num_attention_heads")
        kv = config.get("num_key_value_heads") or heads
        head = config.get("head_dim") or (
            config["hidden_size"] // heads if heads and config.get("hidden_size") else None)
        ctx = config.get("max_position_embeddings")
    values = (layers, kv, head, ctx)
    if not all(isinstance(v, int) and v > 0 for v in values):
        raise DownloadError("the model's config does not give its layers, KV heads, head "
                            f"size and context ({values})")
    return ModelShape(int(layers), int(kv), int(head), int(ctx), kv_dtype_bytes,
                      str(config.get("model", {}).get("type", "") if genai
                          else config.get("model_type", "")))


def onnx_kv_bytes(subfolder: str) -> int:
    """KV element size of an onnxruntime-genai export, from its folder's name: GPU and
    fp16 exports keep float16 KV, CPU exports float32."""
    low = subfolder.lower()
    return 2 if any(k in low for k in ("gpu", "cuda", "dml", "fp16", "webgpu")) else 4


# --- GGUF headers -------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


class _Stream:
    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        self._chunks, self._buf, self._pos, self.read_bytes = chunks, b"", 0, 0
        self._limit = limit

    def read(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                raise DownloadError("the GGUF header ended early (a truncated file?)")
            self._buf = self._buf[self._pos:] + chunk
            self._pos = 0
        out = self._buf[self._pos:self._pos + n]
        self._pos += n
        self.read_bytes += n
        if self.read_bytes > self._limit:
            raise DownloadError("the GGUF header is larger than 64 MiB; not read")
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("<Q")).decode("utf-8", "replace")


def _value(s: _Stream, vtype: int, keep: bool) -> Any:
    if vtype in _SCALARS:
        return s.unpack(_SCALARS[vtype])
    if vtype == 8:
        return s.string()
    if vtype == 9:
        etype, count = s.unpack("<I"), s.unpack("<Q")
        items = [_value(s, etype, keep) for _ in range(count)]
        return items if keep else None
    raise DownloadError(f"unknown GGUF value type {vtype} (not a GGUF file?)")


def parse_gguf_metadata(chunks: Iterator[bytes], limit: int = GGUF_HEADER_LIMIT
                        ) -> dict[str, Any]:
    """The key-value metadata of a GGUF file from its first bytes (arrays are skipped)."""
    s = _Stream(chunks, limit)
    if s.read(4) != b"GGUF":
        raise DownloadError("not a GGUF file (its first bytes are not 'GGUF')")
    version = s.unpack("<I")
    if version < 2:
        raise DownloadError(f"GGUF version {version} is too old; version 2 or 3 is read")
    s.unpack("<Q")  # tensors
    meta: dict[str, Any] = {}
    for _ in range(s.unpack("<Q")):
        key = s.string()
        meta[key] = _value(s, s.unpack("<I"), keep=False)
    return meta


def gguf_metadata(repo_id: str, path: str, endpoint: str, commit: str) -> dict[str, Any]:
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

    url = hf_hub_url(repo_id, path, revision=commit, endpoint=endpoint)
    headers = {**build_hf_headers(), "Range": f"bytes=0-{GGUF_HEADER_LIMIT - 1}"}
    with http_stream_backoff("GET", url, headers=headers,
                             timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                             retry_on_exceptions=(), retry_on_status_codes=(429,)) as response:
        hf_raise_for_status(response)
        return parse_gguf_metadata(response.iter_bytes())


def gguf_shape(meta: dict[str, Any]) -> ModelShape:
    """The shape the engine's importer will give the model (float32 KV)."""
    arch = str(meta.get("general.architecture", ""))
    if arch not in GGUF_ARCHITECTURES:
        raise DownloadError(f"the GGUF's architecture is {arch or 'not named'!r}; the importer "
                            f"converts {', '.join(GGUF_ARCHITECTURES)}")
    heads = meta.get(f"{arch}.attention.head_count")
    kv = meta.get(f"{arch}.attention.head_count_kv") or heads
    head = meta.get(f"{arch}.attention.key_length") or (
        meta.get(f"{arch}.embedding_length", 0) // heads if heads else None)
    values = (meta.get(f"{arch}.block_count"), kv, head, meta.get(f"{arch}.context_length"))
    if not all(isinstance(v, int) and v > 0 for v in values):
        raise DownloadError(f"the GGUF's metadata lacks the model's shape ({values})")
    layers, kv_heads, head_dim, ctx = (int(v) for v in values)  # type: ignore[arg-type]
    return ModelShape(layers, kv_heads, head_dim, ctx, 4, arch)


def quant_of(path: str) -> str | None:
    """The quantization a GGUF file's name says (``Q4_K_M``, ``Q8_0``, ``F16``...)."""
    found = _QUANT.findall(PurePosixPath(path).name)
    return found[-1].upper() if found else None


def gguf_files(files: list[RemoteFile], pattern: str = "*.gguf") -> list[RemoteFile]:
    """The GGUF model files among ``files``: vision projectors and split files left out."""
    out = []
    for f in files:
        name = PurePosixPath(f.path).name
        if (name.lower().endswith(".gguf") and fnmatch.fnmatch(name, pattern or "*.gguf")
                and not name.lower().startswith("mmproj") and not _SPLIT.search(name)):
            out.append(f)
    return out
