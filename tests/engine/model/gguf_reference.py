"""A numpy forward pass read straight from a GGUF file, with llama.cpp's conventions.

It dequantizes each tensor with ``gguf``'s numpy code and applies RoPE the way llama.cpp
does for the architecture (adjacent pairs for llama / mistral, whose Q/K rows llama.cpp's
converter permuted; halves for qwen2 / qwen3), so it checks the importer's row
permutation, norms and attention independently of the ONNX graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, quants


def _field(r: GGUFReader, key: str, default: Any = None) -> Any:
    f = r.fields.get(key)
    return default if f is None else f.contents()


def _w(tensors: dict[str, Any], name: str) -> np.ndarray:
    t = tensors[name]
    qtype = QT(int(t.tensor_type))
    data = np.asarray(t.data)
    out = data.astype(np.float64) if qtype in (QT.F32, QT.F16) else quants.dequantize(data, qtype)
    return np.asarray(out, np.float64).reshape([int(d) for d in reversed(t.shape)])


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, theta: float, adjacent: bool) -> np.ndarray:
    """x: [seq, heads, hd]; positions 0..seq-1."""
    seq, _, hd = x.shape
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(seq)[:, None] * inv[None, :]  # [seq, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if adjacent:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)


def reference_logits(path: str, ids: list[int]) -> np.ndarray:
    """``[len(ids), vocab]`` logits of the GGUF model at ``path`` (float64)."""
    r = GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    arch = str(_field(r, "general.architecture"))
    heads = int(_field(r, f"{arch}.attention.head_count"))
    kv = int(_field(r, f"{arch}.attention.head_count_kv", heads))
    hidden = int(_field(r, f"{arch}.embedding_length"))
    hd = int(_field(r, f"{arch}.attention.key_length", hidden // heads))
    eps = float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon"))
    theta = float(_field(r, f"{arch}.rope.freq_base", 10000.0))
    adjacent = arch in ("llama", "mistral")
    embed = _w(t, "token_embd.weight")
    x = embed[ids]
    seq = len(ids)
    causal = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(int(_field(r, f"{arch}.block_count"))):
        p = f"blk.{i}."
        h = _rms(x, _w(t, p + "attn_norm.weight"), eps)
        proj = {}
        for name, n in (("q", heads), ("k", kv), ("v", kv)):
            y = h @ _w(t, p + f"attn_{name}.weight").T
            if p + f"attn_{name}.bias" in t:
                y = y + _w(t, p + f"attn_{name}.bias")
            y = y.reshape(seq, n, hd)
            if name != "v" and p + f"attn_{name}_norm.weight" in t:
                y = _rms(y, _w(t, p + f"attn_{name}_norm.weight"), eps)
            proj[name] = _rope(y, theta, adjacent) if name != "v" else y
        group = heads // kv
        k = np.repeat(proj["k"], group, axis=1)
        v = np.repeat(proj["v"], group, axis=1)
        scores = np.einsum("qhd,khd->hqk", proj["q"], k) / np.sqrt(hd) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", scores, v).reshape(seq, heads * hd)
        x = x + attn @ _w(t, p + "attn_output.weight").T
        h = _rms(x, _w(t, p + "ffn_norm.weight"), eps)
        gate = h @ _w(t, p + "ffn_gate.weight").T
        up = h @ _w(t, p + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ _w(t, p + "ffn_down.weight").T
    x = _rms(x, _w(t, "output_norm.weight"), eps)
    head = _w(t, "output.weight") if "output.weight" in t else embed
    return x @ head.T
