"""One GGUF tensor at a time into the form the graph stores, per ``--precision``.

=========  =====================================  ==============================
precision  quantized tensors                      float tensors (F32, F16, BF16)
=========  =====================================  ==============================
auto       Q4_0, Q4_1, Q4_K (4-bit) and Q5_0,     kept: F16 as fp16, F32 and
           Q5_1, Q5_K, Q6_K, Q8_0 (8-bit) as      BF16 as fp32
           they are; others (Q2_K, Q3_K, IQ*)
           re-quantized to int4
int4       the 4-bit ones as they are; others     quantized to int4
           re-quantized to int4
int8       all of the above as they are (4-bit    quantized to int8
           codes widened); others to int8
fp16/fp32  dequantized                            converted
=========  =====================================  ==============================

Every weight is recorded (its GGUF type, what it became, and whether that is lossless).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from engine.model.gguf_blocks import (
    BLOCK,
    BlockWeight,
    from_q4_0,
    from_q4_1,
    from_q4_k,
    from_q5_0,
    from_q5_1,
    from_q5_k,
    from_q6_k,
    from_q8_0,
    quantize4,
    quantize8,
    widen,
)
from engine.model.gguf_graph import Linear

PRECISIONS = ("auto", "int4", "int8", "fp16", "fp32")
_EXACT = {QT.Q4_0: from_q4_0, QT.Q4_1: from_q4_1, QT.Q8_0: from_q8_0, QT.Q4_K: from_q4_k,
          QT.Q5_K: from_q5_k, QT.Q5_0: from_q5_0, QT.Q5_1: from_q5_1, QT.Q6_K: from_q6_k}
_FLOATS = (QT.F32, QT.F16, QT.BF16)
_WIDE = {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_1", "Q8_K"}
_ROWS = 2048


@dataclass
class WeightLog:
    """What became of each weight."""

    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, name: str, gguf_type: str, stored: str, lossless: bool) -> None:
        self.tensors[name] = {"gguf_type": gguf_type, "stored": stored, "lossless": lossless}

    def summary(self) -> dict[str, Any]:
        lossless = sorted(n for n, t in self.tensors.items() if t["lossless"])
        changed = sorted(n for n, t in self.tensors.items() if not t["lossless"])
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            key = f"{t['gguf_type']} -> {t['stored']}"
            counts[key] = counts.get(key, 0) + 1
        return {"lossless": len(lossless), "requantized_or_rounded": len(changed),
                "conversions": counts, "requantized_tensors": changed}


def dequantize(tensor: Any, rows: np.ndarray | None = None) -> np.ndarray:
    """A GGUF tensor (or ``rows`` of it) as fp32 ``[rows, K]`` (or ``[K]``), via gguf's
    numpy code."""
    data = np.asarray(tensor.data if rows is None else rows)
    qtype = QT(int(tensor.tensor_type))
    if qtype in (QT.F32, QT.F16):
        out = data.astype(np.float32)
    else:
        out = quants.dequantize(data, qtype).astype(np.float32)
    shape = [int(d) for d in reversed(tensor.shape)]
    return out.reshape(shape if rows is None else [-1, shape[-1]])


def requantize(tensor: Any, raw: np.ndarray, bits: int) -> BlockWeight:
    """Dequantize and quantize again, ``_ROWS`` rows at a time: a tensor's fp32 copy is
    never whole in memory (a 150k-token embedding would be gigabytes). 4-bit blocks are of
    16 for the types whose own scales change every 16 values (Q2_K, Q3_K)."""
    block = 16 if QT(int(tensor.tensor_type)) in (QT.Q2_K, QT.Q3_K) else BLOCK

    def quantize(w: np.ndarray) -> BlockWeight:
        return quantize8(w) if bits == 8 else quantize4(w, block)

    parts = [quantize(dequantize(tensor, raw[at:at + _ROWS]))
             for at in range(0, raw.shape[0], _ROWS)]
    return BlockWeight(bits, np.concatenate([p.codes for p in parts]),
                       np.concatenate([p.scales for p in parts]),
                       None if bits == 8 else np.concatenate(
                           [p.minimum for p in parts if p.minimum is not None]), False)


def vector(tensor: Any) -> np.ndarray:
    """A 1-D tensor (norm weights, biases) as fp32."""
    return dequantize(tensor).reshape(-1)


def unpermute_rows(raw: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order for its interleaved RoPE: rows of each head go back to
    Hugging Face's order (rotate-half RoPE). Works on raw rows of any type."""
    n = raw.shape[0]
    rest = raw.shape[1:]
    return np.ascontiguousarray(raw.reshape(heads, n // heads // 2, 2, *rest)
                                .swapaxes(1, 2).reshape(n, *rest))


class WeightReader:
    """Turns GGUF tensors into :data:`Linear` weights per ``precision``; logs each one."""

    def __init__(self, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}")
        self.precision = precision
        self.log = WeightLog()

    def linear(self, tensor: Any, heads: int | None = None) -> Linear:
        """A ``[N, K]`` projection; ``heads``: undo the Q/K row permutation first."""
        qtype = QT(int(tensor.tensor_type))
        k, n = (int(d) for d in tensor.shape[:2])
        raw = np.asarray(tensor.data).reshape(n, -1)
        if heads:
            raw = unpermute_rows(raw, heads)
        out, stored, lossless = self._convert(tensor, qtype, raw, n, k)
        self.log.add(tensor.name, qtype.name, stored, lossless)
        return out

    def _convert(self, tensor: Any, qtype: QT, raw: np.ndarray, n: int,
                 k: int) -> tuple[Linear, str, bool]:
        p = self.precision
        if p in ("fp16", "fp32") or k % BLOCK:
            w = dequantize(tensor, raw)
            if p == "fp16" and k % BLOCK == 0:
                exact = qtype in (QT.F16,)
                return w.astype(np.float16), "fp16", exact
            return w, "fp32", True
        if qtype in _EXACT:
            bw = _EXACT[qtype](raw, n, k)
            if p == "int4" and bw.bits == 8:
                return _named(requantize(tensor, raw, 4))
            if p == "int8":
                bw = widen(bw)
            return bw, f"int{bw.bits}", True
        if qtype in _FLOATS and p == "auto":
            if qtype == QT.F16:
                return np.asarray(raw).view(np.float16).reshape(n, k), "fp16", True
            return dequantize(tensor, raw), "fp32", True
        bits = 8 if p == "int8" or (p == "auto" and qtype.name in _WIDE) else 4
        return _named(requantize(tensor, raw, bits))


def _named(bw: BlockWeight) -> tuple[Linear, str, bool]:
    return bw, f"int{bw.bits}", bw.lossless
