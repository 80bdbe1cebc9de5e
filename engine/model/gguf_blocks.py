"""GGUF weight blocks as ONNX Runtime's ``MatMulNBits`` blocks, losslessly where they fit.

A :class:`BlockWeight` is an ``[N, K]`` weight in blocks of ``block`` along K. Without
``minimum`` each value is ``scale * (code - zp)`` with ``zp = 2**(bits-1)`` (MatMulNBits'
default zero point: 8 for 4 bits, 128 for 8 bits); with ``minimum`` it is
``scale * (code - shift) + minimum`` (GGUF's Q4_1 form; ``shift`` keeps codes widened to
8 bits around the zero point), which the graph computes as MatMulNBits on
``scale * (code - zp)`` plus one small MatMul of the input's block sums by
``minimum + (zp - shift) * scale`` (the approach of ``tools/gguf_exact.py``).

- Q4_0 (``d * (q - 8)``) and Q8_0 (``d * q``) are repacked as they are: same blocks of 32,
  same fp16 scales, same codes.
- Q4_1 (``d * q + m``) keeps its codes, ``d`` and ``m``.
- Q5_0 and Q5_1 keep their blocks as 8-bit codes (5 bits do not fit 4).
- Q4_K and Q5_K (super-blocks of 256 in sub-blocks of 32, each ``(d * sc) * q - dmin * m``)
  become blocks of 32 with fp32 scale and minimum; Q6_K (sub-blocks of 16,
  ``(d * sc) * (q - 32)``) 8-bit blocks of 16: exact too.
- Anything else (Q2_K, Q3_K, IQ types, floats asked to be quantized) is dequantized by
  ``gguf``'s numpy code and quantized again: 4 bits as Q4_1 (per-block min and max; blocks
  of 16 for Q2_K and Q3_K), 8 bits as Q8_0 (per-block absolute max). Those are marked
  ``lossless=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32


class NotExact(RuntimeError):
    """A weight that is not a dequantized Q4_1 / Q8_0 tensor."""


@dataclass
class Factors:
    """Scales (and minimums) as the K-quants store them: an fp16 per super-block times a
    small integer per sub-block (``scale = d * sc``, ``minimum = -dmin * m``). The file
    keeps these (as small as the GGUF's); the graph multiplies them back in fp32, which
    ONNX Runtime folds at load into exactly ``scales`` / ``minimum``."""

    d: np.ndarray  # [N, S] float16
    sc: np.ndarray  # [N, S, per] uint8 or int8
    dmin: np.ndarray | None = None  # [N, S] float16
    m: np.ndarray | None = None  # [N, S, per] uint8


@dataclass
class BlockWeight:
    """An ``[N, K]`` weight as blocks (see the module's docstring)."""

    bits: int
    codes: np.ndarray  # [N, blocks, BLOCK] uint8, unpacked
    scales: np.ndarray  # [N, blocks] float16 or float32
    minimum: np.ndarray | None  # [N, blocks], same dtype as scales, or None
    lossless: bool
    #: with ``minimum``: the codes are stored plus this (``scale * (code - shift) + minimum``),
    #: so 4-bit codes widened to 8 bits stay centred on the zero point
    shift: int = 0
    #: K-quants: ``scales`` and ``minimum`` as stored factors (None: stored as they are)
    factors: Factors | None = None

    @property
    def block(self) -> int:
        """Values per block along K: 32 (16 for Q6_K kept as it is)."""
        return int(self.codes.shape[2])

    @property
    def shape(self) -> tuple[int, int]:
        n, blocks, block = self.codes.shape
        return n, blocks * block

    def packed(self) -> np.ndarray:
        """The codes as MatMulNBits' ``B`` input: ``[N, blocks, BLOCK * bits / 8]``."""
        return pack4(self.codes) if self.bits == 4 else self.codes

    def offsets(self) -> np.ndarray | None:
        """``minimum + zp * scale`` in fp32, ``[N, blocks]`` (None without a minimum)."""
        if self.minimum is None:
            return None
        zp = float(2 ** (self.bits - 1) - self.shift)
        return self.minimum.astype(np.float32) + zp * self.scales.astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """The fp32 ``[N, K]`` weight these blocks stand for."""
        s = self.scales.astype(np.float32)[..., None]
        if self.minimum is None:
            w = s * (self.codes.astype(np.float32) - 2 ** (self.bits - 1))
        else:
            w = (s * (self.codes.astype(np.float32) - self.shift)
                 + self.minimum.astype(np.float32)[..., None])
        return w.reshape(self.shape)


def pack4(q: np.ndarray) -> np.ndarray:
    """``[N, blocks, 32]`` 4-bit codes as MatMulNBits stores them: two a byte, low first."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _gguf_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF's 16 bytes of a 4-bit block (``[..., 16]``) as 32 codes: element ``j`` is the
    low nibble of byte ``j``, element ``j + 16`` its high nibble."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """``[..., 2]`` bytes as float16 ``[...]``."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0]


def from_q4_0(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q4_0 rows (``[N, K / 32 * 18]`` bytes) without loss."""
    b = np.asarray(raw, np.uint8).reshape(n, k // BLOCK, 18)
    return BlockWeight(4, _gguf_nibbles(b[..., 2:]), _fp16(b[..., 0:2]), None, True)


def from_q4_1(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q4_1 rows (``[N, K / 32 * 20]`` bytes) without loss."""
    b = np.asarray(raw, np.uint8).reshape(n, k // BLOCK, 20)
    return BlockWeight(4, _gguf_nibbles(b[..., 4:]), _fp16(b[..., 0:2]), _fp16(b[..., 2:4]),
                       True)


def from_q8_0(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q8_0 rows (``[N, K / 32 * 34]`` bytes) without loss (codes offset by 128)."""
    b = np.asarray(raw, np.uint8).reshape(n, k // BLOCK, 34)
    q = b[..., 2:] ^ np.uint8(0x80)  # int8 q + 128 as uint8: the sign bit flipped
    return BlockWeight(8, q, _fp16(b[..., 0:2]), None, True)


def _k_quant_parts(raw: np.ndarray, n: int, k: int, size: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Factors]:
    """A Q4_K / Q5_K super-block's sub-block scales ``d * sc`` and minimums ``-dmin * m``
    (fp32: exact, an fp16 times a 6-bit integer), its remaining bytes and the factors."""
    from gguf.quants import Q4_K

    b = np.asarray(raw, np.uint8).reshape(-1, size)
    d16, dmin16 = _fp16(b[:, 0:2]), _fp16(b[:, 2:4])
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))
    scales = (d16.astype(np.float32)[:, None] * sc.astype(np.float32)).reshape(n, k // BLOCK)
    minimum = (-(dmin16.astype(np.float32)[:, None] * m.astype(np.float32))
               ).reshape(n, k // BLOCK)
    s = k // 256
    factors = Factors(d16.reshape(n, s), sc.astype(np.uint8).reshape(n, s, 8),
                      dmin16.reshape(n, s), m.astype(np.uint8).reshape(n, s, 8))
    return scales, minimum, b[:, 16:], factors


def _low_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """K-quant 4-bit bytes ``[blocks, 128]`` as ``[blocks, 8, 32]`` codes: each 32 bytes
    hold one sub-block in their low nibbles and the next in their high ones."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(-1, 8, 32)


def from_q4_k(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q4_K rows without loss: each sub-block of 32 is ``(d * sc) * q - dmin * m``, a Q4_1
    block with fp32 scale and minimum."""
    scales, minimum, qs, factors = _k_quant_parts(raw, n, k, 144)
    codes = _low_high_nibbles(qs).reshape(n, k // BLOCK, BLOCK)
    return BlockWeight(4, codes, scales, minimum, True, factors=factors)


def from_q5_k(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q5_K rows without loss, as 8-bit blocks (5-bit codes moved up by 112 to sit around
    the zero point 128)."""
    scales, minimum, rest, factors = _k_quant_parts(raw, n, k, 176)
    qh, qs = rest[:, :32], rest[:, 32:]
    high = (qh.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    codes = _low_high_nibbles(qs) | (high << np.uint8(4))
    return BlockWeight(8, (codes + np.uint8(112)).reshape(n, k // BLOCK, BLOCK), scales,
                       minimum, True, shift=112, factors=factors)


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1 codes ``[blocks, 32]`` from 4 bytes of high bits and 16 of nibbles."""
    high = (qh.copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
    return _gguf_nibbles(qs) | (high.astype(np.uint8) << np.uint8(4))


def from_q5_0(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q5_0 rows (``d * (q - 16)``) without loss, as 8-bit codes ``q + 112``."""
    b = np.asarray(raw, np.uint8).reshape(-1, 22)
    codes = (_five_bit(b[:, 2:6], b[:, 6:]) + np.uint8(112)).reshape(n, k // BLOCK, BLOCK)
    return BlockWeight(8, codes, _fp16(b[:, 0:2]).reshape(n, k // BLOCK), None, True)


def from_q5_1(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q5_1 rows (``d * q + m``) without loss, as 8-bit codes ``q + 112``."""
    b = np.asarray(raw, np.uint8).reshape(-1, 24)
    codes = (_five_bit(b[:, 4:8], b[:, 8:]) + np.uint8(112)).reshape(n, k // BLOCK, BLOCK)
    return BlockWeight(8, codes, _fp16(b[:, 0:2]).reshape(n, k // BLOCK),
                       _fp16(b[:, 2:4]).reshape(n, k // BLOCK), True, shift=112)


def from_q6_k(raw: np.ndarray, n: int, k: int) -> BlockWeight:
    """Q6_K rows without loss: sub-blocks of 16, each ``(d * sc) * (q - 32)`` with a signed
    8-bit ``sc``, as 8-bit blocks of 16 (codes ``q + 96``, fp32 scales)."""
    b = np.asarray(raw, np.uint8).reshape(-1, 210)
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
    low = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = low.reshape(-1, 8, 32) | (high.reshape(-1, 8, 32) << np.uint8(4))
    d16, sc8 = _fp16(d), sc.view(np.int8)
    scales = d16.astype(np.float32)[:, None] * sc8.astype(np.float32)
    factors = Factors(d16.reshape(n, k // 256), sc8.reshape(n, k // 256, 16))
    return BlockWeight(8, (q + np.uint8(96)).reshape(n, k // 16, 16),
                       scales.reshape(n, k // 16), None, True, factors=factors)


def widen(w: BlockWeight) -> BlockWeight:
    """4-bit blocks as 8-bit blocks, without loss (for ``--precision int8``). The codes move
    up by 120 so they stay centred on the zero point: MatMulNBits on int8-quantized inputs
    (accuracy level 4) would otherwise lose the small weights next to a large offset."""
    if w.bits == 8:
        return w
    codes = (w.codes.astype(np.int16) + 120).astype(np.uint8)
    return BlockWeight(8, codes, w.scales, w.minimum, w.lossless,
                       shift=120 if w.minimum is not None else 0, factors=w.factors)


def quantize4(w: np.ndarray, block: int = BLOCK) -> BlockWeight:
    """An fp32 ``[N, K]`` weight as Q4_1-style blocks (min and max of each block, fp16
    ``d`` and ``m``, codes rounded against the fp16 values): lossy."""
    n, k = w.shape
    b = w.reshape(n, k // block, block).astype(np.float32)
    lo, hi = b.min(-1), b.max(-1)
    m = lo.astype(np.float16)
    d = (np.maximum(hi - m.astype(np.float32), 0) / 15).astype(np.float16)
    d32 = d.astype(np.float32)[..., None]
    q = np.round((b - m.astype(np.float32)[..., None]) / np.where(d32 == 0, 1, d32))
    return BlockWeight(4, np.clip(q, 0, 15).astype(np.uint8), d, m, False)


def quantize8(w: np.ndarray) -> BlockWeight:
    """An fp32 ``[N, K]`` weight as Q8_0-style blocks (absolute max / 127): lossy."""
    n, k = w.shape
    b = w.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    d = (np.abs(b).max(-1) / 127).astype(np.float16)
    d32 = d.astype(np.float32)[..., None]
    q = np.clip(np.round(b / np.where(d32 == 0, 1, d32)), -127, 127) + 128
    return BlockWeight(8, q.astype(np.uint8), d, None, False)


def concat_rows(parts: list[BlockWeight]) -> BlockWeight | None:
    """Several weights on the same input stacked along N (q, k and v into one qkv), or None
    when their forms differ (then they stay separate)."""
    first = parts[0]
    if any(p.bits != first.bits or (p.minimum is None) != (first.minimum is None)
           or p.scales.dtype != first.scales.dtype or p.codes.shape[1] != first.codes.shape[1]
           or p.shift != first.shift or p.block != first.block
           for p in parts):
        return None
    minimum = (None if first.minimum is None
               else np.concatenate([p.minimum for p in parts if p.minimum is not None]))
    return BlockWeight(first.bits, np.concatenate([p.codes for p in parts]),
                       np.concatenate([p.scales for p in parts]), minimum,
                       all(p.lossless for p in parts), first.shift, _concat_factors(parts))


def _concat_factors(parts: list[BlockWeight]) -> Factors | None:
    """The parts' factors stacked, when every part has them in one form (else None: the
    stacked weight stores its scales as they are)."""
    factors = [p.factors for p in parts]
    if any(f is None for f in factors):
        return None
    fs = [f for f in factors if f is not None]
    if len({(f.sc.dtype, f.sc.shape[1:], f.dmin is None) for f in fs}) != 1:
        return None
    minimums = [(f.dmin, f.m) for f in fs if f.dmin is not None and f.m is not None]
    return Factors(np.concatenate([f.d for f in fs]), np.concatenate([f.sc for f in fs]),
                   np.concatenate([d for d, _ in minimums]) if minimums else None,
                   np.concatenate([m for _, m in minimums]) if minimums else None)


# -- read back from dequantized fp32 weights (tools/gguf_exact.py) -------------------------

def q4_1_blocks(w: np.ndarray, name: str) -> BlockWeight:
    """The Q4_1 blocks of a dequantized ``[N, K]`` weight (exact, or NotExact). A Q4_1
    block's min is ``m`` and its max ``m + 15 d`` (llama.cpp's rounding hits both)."""
    n, k = w.shape
    b = w.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    lo, hi = b.min(-1), b.max(-1)
    d = ((hi - lo) / 15).astype(np.float16)
    d32 = d.astype(np.float32)[..., None]
    q = np.clip(np.round((b - lo[..., None]) / np.where(d32 == 0, 1, d32)), 0, 15)
    m = lo.astype(np.float16)
    if not np.array_equal(d32 * q + m.astype(np.float32)[..., None], b):
        raise NotExact(f"{name} is not a dequantized Q4_1 tensor")
    return BlockWeight(4, q.astype(np.uint8), d, m, True)


def q8_0_blocks(w: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The Q8_0 codes (as uint8, offset 128) ``[N, K]`` and fp16 scales of a dequantized
    ``[N, K]`` weight (the largest ``|w|`` of a block is ``127 d``), or NotExact."""
    n, k = w.shape
    b = w.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    d = (np.abs(b).max(-1) / 127).astype(np.float16)
    d32 = d.astype(np.float32)[..., None]
    q = np.clip(np.round(b / np.where(d32 == 0, 1, d32)), -127, 127)
    if not np.array_equal(d32 * q, b):
        raise NotExact(f"{name} is not a dequantized Q8_0 tensor")
    return (q + 128).astype(np.uint8).reshape(n, k), d
