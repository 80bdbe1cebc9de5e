"""How a model rotates its keys by position (rotary embeddings), read from the model itself.

Cached keys are stored after the rotation. Moving a cached key from position p to q
(engine.kv.shift) multiplies each of its rotated pairs by the rotation of angle
θ(q) - θ(p), which this module derives from:

- the graph's own tables: the ``cos_cache``/``sin_cache`` initializers that every
  GroupQueryAttention node with ``do_rotary=1`` (or every RotaryEmbedding node) reads, with
  its ``rotary_interleaved`` (``interleaved``) attribute. Whatever scaling the exporter
  baked into the tables (linear, NTK, llama 3, YaRN's magnitude factor) is in them, so the
  rotation is exact for it;
- else, for graphs that rotate inside with standard operators (optimum exports), the
  model's config.json: ``rope_theta``, ``partial_rotary_factor``/``rotary_dim``,
  ``head_dim`` and ``rope_scaling`` of type default or linear, for model types known to use
  rotate-half rotary embeddings.

Anything else (unknown scaling, ALiBi, absolute position embeddings, tables computed by the
graph) gives no rotation, with the reason: shifting is then refused and such KV recomputed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.model.onnx_scan import ELEM_TYPES, Initializer, ScanError, scan_onnx

#: config.json model types whose attention rotates every key with rotate-half RoPE.
ROTATE_HALF_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
                               "granite", "olmo", "olmo2", "smollm3", "phi3", "starcoder2"})


@dataclass(frozen=True)
class KeyRotation:
    """Per position, the cosine and sine of each rotated pair's angle."""

    cos: np.ndarray  # [positions, rotary_dim / 2] float64
    sin: np.ndarray
    interleaved: bool
    #: Where the table came from (shown in describe()).
    source: str

    @property
    def rotary_dim(self) -> int:
        return 2 * self.cos.shape[1]

    @property
    def positions(self) -> int:
        return self.cos.shape[0]

    def shift(self, keys: np.ndarray, src: int, dst: int) -> np.ndarray:
        """Keys `[heads, n, head_dim]` rotated for positions `src..src+n` moved to
        `dst..dst+n` (a new array; `keys` is left as it is)."""
        n = keys.shape[1]
        if src == dst or n == 0:
            return keys.copy()
        if max(src, dst) + n > self.positions or min(src, dst) < 0:
            raise ValueError(f"positions {src}/{dst}+{n} are past the rotary table "
                             f"({self.positions} positions)")
        rot = self.rotary_dim
        if rot > keys.shape[2]:
            raise ValueError(f"rotary dim {rot} exceeds the head dim {keys.shape[2]}")
        cp, sp = self.cos[src:src + n], self.sin[src:src + n]
        cq, sq = self.cos[dst:dst + n], self.sin[dst:dst + n]
        # The angle θ(q) - θ(p): cos and sin of the difference.
        c = (cq * cp + sq * sp).astype(np.float32)[None]
        s = (sq * cp - cq * sp).astype(np.float32)[None]
        out = keys.astype(np.float32, copy=True)
        if self.interleaved:
            x1, x2 = out[..., 0:rot:2].copy(), out[..., 1:rot:2].copy()
            out[..., 0:rot:2] = x1 * c - x2 * s
            out[..., 1:rot:2] = x1 * s + x2 * c
        else:
            half = rot // 2
            x1, x2 = out[..., :half].copy(), out[..., half:rot].copy()
            out[..., :half] = x1 * c - x2 * s
            out[..., half:rot] = x1 * s + x2 * c
        return out.astype(keys.dtype, copy=False)


@dataclass(frozen=True)
class RotaryFinding:
    rotation: KeyRotation | None
    #: Why there is no rotation (None when there is one).
    reason: str | None

    def as_dict(self) -> dict[str, object]:
        r = self.rotation
        return {"shift": r is not None, "reason": self.reason,
                "source": None if r is None else r.source,
                "rotary_dim": None if r is None else r.rotary_dim,
                "interleaved": None if r is None else r.interleaved}


def _unit(cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tables scaled by a magnitude factor (YaRN) hold m·cos, m·sin: keep the angle."""
    norm = np.sqrt(cos * cos + sin * sin)
    norm[norm == 0] = 1.0
    return cos / norm, sin / norm


def read_initializer(model_file: Path, tensor: Initializer) -> np.ndarray:
    """The values of a scanned initializer, inline (raw_data) or in an external file."""
    dtype = ELEM_TYPES.get(tensor.data_type)
    if dtype not in ("float32", "float16", "float64"):
        raise ValueError(f"{tensor.name} has data type {tensor.data_type}")
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    item = np.dtype(dtype).newbyteorder("<")
    if tensor.data_location == 1:
        location = tensor.external.get("location", "")
        offset = int(tensor.external.get("offset", 0))
        with open(model_file.parent / location, "rb") as f:
            f.seek(offset)
            data = f.read(count * item.itemsize)
    elif tensor.raw is not None:
        with open(model_file, "rb") as f:
            f.seek(tensor.raw[0])
            data = f.read(tensor.raw[1] - tensor.raw[0])
    else:
        raise ValueError(f"{tensor.name} keeps its values outside raw_data")
    if len(data) != count * item.itemsize:
        raise ValueError(f"{tensor.name}: {len(data)} bytes for {count} values")
    return np.frombuffer(data, item).reshape(tensor.dims).astype(np.float64)


def from_graph(model_file: Path) -> RotaryFinding | None:
    """The rotation the graph's fused rotary nodes apply; None when the graph has none."""
    try:
        scanned = scan_onnx(model_file)
    except (ScanError, OSError) as exc:
        return RotaryFinding(None, f"the graph cannot be read ({exc})")
    uses: set[tuple[str, str, int]] = set()
    for node in scanned.nodes:
        if node.op_type == "GroupQueryAttention" and node.ints.get("do_rotary"):
            if len(node.inputs) < 9:
                return RotaryFinding(None, "a GroupQueryAttention rotates without tables")
            uses.add((node.inputs[7], node.inputs[8], node.ints.get("rotary_interleaved", 0)))
        elif node.op_type == "RotaryEmbedding" and len(node.inputs) >= 4:
            if node.ints.get("is_packed_batching"):
                return RotaryFinding(None, "a RotaryEmbedding node with a packed layout")
            uses.add((node.inputs[2], node.inputs[3], node.ints.get("interleaved", 0)))
    if not uses:
        return None
    if len(uses) != 1:
        return RotaryFinding(None, "the layers rotate with different tables")
    ((cos_name, sin_name, interleaved),) = uses
    tensors = {t.name: t for t in scanned.initializers}
    if cos_name not in tensors or sin_name not in tensors:
        return RotaryFinding(None, "the rotary tables are computed by the graph, not stored")
    try:
        cos = read_initializer(model_file, tensors[cos_name])
        sin = read_initializer(model_file, tensors[sin_name])
    except (ValueError, OSError) as exc:
        return RotaryFinding(None, f"the rotary tables cannot be read ({exc})")
    if cos.ndim != 2 or cos.shape != sin.shape:
        return RotaryFinding(None, f"rotary tables of shapes {cos.shape} and {sin.shape}")
    cos, sin = _unit(cos, sin)
    return RotaryFinding(KeyRotation(cos, sin, bool(interleaved), "graph tables"), None)


def from_config(config_file: Path, positions: int, head_dim: int) -> RotaryFinding:
    """The rotation a config.json declares, for model types known to use rotate-half."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return RotaryFinding(None, f"no readable config.json ({exc})")
    kind = config.get("model_type")
    if kind not in ROTATE_HALF_TYPES:
        return RotaryFinding(None, f"model type {kind!r} is not known to use rotary "
                                   "embeddings on every key")
    scaling = config.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", "linear"):
        return RotaryFinding(None, f"rope scaling {rope_type!r} is not derived here")
    theta = float(config.get("rope_theta", 10000.0))
    dim = int(config.get("rotary_dim") or head_dim * float(config.get("partial_rotary_factor",
                                                                          1.0)))
    if dim <= 0 or dim % 2 or dim > head_dim:
        return RotaryFinding(None, f"rotary dim {dim} does not fit the head dim {head_dim}")
    factor = float(scaling.get("factor", 1.0)) if rope_type == "linear" else 1.0
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.outer(np.arange(positions, dtype=np.float64) / factor, inv)
    return RotaryFinding(KeyRotation(np.cos(angles), np.sin(angles), False,
                                     f"config.json (rope_theta {theta:g})"), None)


def key_rotation(model_file: Path, config_file: Path, positions: int,
                 head_dim: int) -> RotaryFinding:
    """The rotation that moves this model's cached keys, or why there is none."""
    found = from_graph(model_file)
    if found is not None:
        return found
    if not config_file.is_file():
        return RotaryFinding(None, "the graph has no rotary tables and the folder no "
                                   "config.json to derive them from")
    return from_config(config_file, positions, head_dim)
