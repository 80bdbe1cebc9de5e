"""Int8 quantization of KV blocks that leave the device (host RAM and disk tiers).

One symmetric scale per head: ``scale[h] = max|x[h]| / 127`` and
``q = round(x / scale)`` in ``[-127, 127]``. A block of ``[heads, tokens, head_dim]``
costs ``heads * tokens * head_dim`` bytes of data plus ``4 * heads`` bytes of scales;
:attr:`QuantizedKV.nbytes` counts both, and that is what the memory accounting uses.
The error is bounded by half a step: ``|x - dequant(q)| <= scale[h] / 2``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.model.kv16_pass import i16_row_limit, row_extra

__all__ = ["QuantizedKV", "dequantize_int8", "float_to_rows",
           "quantization_error", "quantize_int8", "rows_shifted", "rows_to_float", "value_dim"]

_QMAX = 127.0
_FLOAT_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class QuantizedKV:
    """One int8 KV block: ``data`` [heads, tokens, head_dim], ``scales`` [heads].

    ``dtype`` is the dtype the block had before quantization ("float32" or "float16");
    :func:`dequantize_int8` returns that dtype.
    """

    data: np.ndarray
    scales: np.ndarray
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes this block holds: int8 data plus float32 scales."""
        return int(self.data.nbytes + self.scales.nbytes)

    @property
    def shape(self) -> tuple[int, int, int]:
        heads, tokens, head_dim = self.data.shape
        return int(heads), int(tokens), int(head_dim)


def _check_kv(kv: np.ndarray) -> None:
    if not isinstance(kv, np.ndarray) or kv.ndim != 3:
        got = f"ndim={kv.ndim}" if isinstance(kv, np.ndarray) else type(kv).__name__
        raise ValueError(
            f"KV block: expected a 3-D array [heads, tokens, head_dim], got {got}; "
            "pass one KV tensor of one sequence without its batch axis"
        )
    if kv.dtype.name not in _FLOAT_DTYPES:
        raise ValueError(
            f"KV block: expected dtype float32 or float16, got {kv.dtype.name}; "
            "only floating-point KV can be quantized"
        )


def quantize_int8(kv: np.ndarray) -> QuantizedKV:
    """Quantize ``kv`` [heads, tokens, head_dim] (float32/float16) to int8, one scale per head.

    An all-zero head gets scale 0 and dequantizes to exact zeros. Raises ``ValueError`` on
    a malformed array or on NaN/inf values (their scale would poison the whole head).
    """
    _check_kv(kv)
    x = kv.astype(np.float32, copy=False)
    # max|x| as max(max, -min): two reductions, no |x| temporary.
    absmax = np.maximum(
        np.max(x, axis=(1, 2), initial=-np.inf), -np.min(x, axis=(1, 2), initial=np.inf)
    )
    absmax = np.maximum(absmax, 0.0)  # empty heads reduce to -inf
    if not np.all(np.isfinite(absmax)):
        raise ValueError(
            "KV block: found NaN or inf values; non-finite KV cannot be quantized "
            "(keep such blocks unquantized or recompute them)"
        )
    scales = (absmax / _QMAX).astype(np.float32)
    inverse = np.divide(
        np.float32(1.0), scales, out=np.zeros_like(scales), where=scales > 0
    )
    scaled = x * inverse[:, None, None]
    np.rint(scaled, out=scaled)
    # |x| * (1/scale) can round to 127.00001; clip keeps it in range.
    np.clip(scaled, -_QMAX, _QMAX, out=scaled)
    return QuantizedKV(data=scaled.astype(np.int8), scales=scales, dtype=kv.dtype.name)


def dequantize_int8(q: QuantizedKV) -> np.ndarray:
    """Return the block in its original dtype: ``data * scale[head]``."""
    out = q.data.astype(np.float32)
    out *= q.scales[:, None, None]
    return out if q.dtype == "float32" else out.astype(q.dtype)


def quantization_error(kv: np.ndarray) -> dict[str, float]:
    """Round-trip ``kv`` through int8 and report what it costs.

    Keys: ``max_abs_error``, ``mean_abs_error``, ``relative_error`` (the error's L2 norm
    over the block's L2 norm; 0 for an all-zero block), ``raw_bytes``, ``quantized_bytes``.
    """
    q = quantize_int8(kv)
    x = kv.astype(np.float64)
    err = np.abs(dequantize_int8(q).astype(np.float64) - x)
    norm = float(np.linalg.norm(x))
    return {
        "max_abs_error": float(err.max(initial=0.0)),
        "mean_abs_error": float(err.mean()) if err.size else 0.0,
        "relative_error": float(np.linalg.norm(err)) / norm if norm > 0 else 0.0,
        "raw_bytes": float(kv.nbytes),
        "quantized_bytes": float(q.nbytes),
    }


# --- the live int8 and int16 caches' rows (engine.model.kv16_pass, engine/kernels) ---------
# An int8 row: head_dim int8 values, then their scale as a bfloat16 (I8_SCALE_BYTES bytes).
# An int16 row: head_dim int16 whole numbers, then their scale as a bfloat16 (one int16).

_ROWS = ("int8", "int16")


def value_dim(head_dim: int, dtype: str) -> int:
    """The values a cache row of `head_dim` elements of `dtype` holds (int8, int16: less
    their scale's elements)."""
    return head_dim - row_extra(dtype)


def _row_scales(rows: np.ndarray, d: int) -> np.ndarray:
    """The rows' bfloat16 scales (after their `d` values) as float32 `[..., 1]`."""
    bits = np.ascontiguousarray(rows[..., d:]).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def rows_to_float(rows: np.ndarray) -> np.ndarray:
    """int8 cache rows `[..., head_dim + 2]` or int16 rows `[..., head_dim + 1]` as float32
    `[..., head_dim]`: q * scale, the kernel's one multiply (exact for int16 rows)."""
    if rows.dtype.name not in _ROWS:
        raise ValueError(f"cache rows: expected int8 or int16 rows, got {rows.dtype.name}")
    d = rows.shape[-1] - row_extra(rows.dtype.name)
    return rows[..., :d].astype(np.float32) * _row_scales(rows, d)


def _bfloat16_bits(exact: np.ndarray, up: bool) -> np.ndarray:
    """float32 values >= 0 as bfloat16 bits: to nearest (ties to even), or `up`; inf and
    NaN as they are."""
    wide = exact.view(np.uint32)
    finite = (wide & 0x7F800000) != 0x7F800000
    step = np.uint32(0xFFFF) if up else 0x7FFF + ((wide >> 16) & 1)
    return ((wide + np.where(finite, step, 0).astype(np.uint32)) >> 16).astype("<u2")


def float_to_rows(x: np.ndarray, element: str = "int8") -> np.ndarray:
    """float rows `[..., head_dim]` as cache rows of `element`, quantized as the kernel
    writes them. int8: scale = largest |x| / 127 per row rounded to the nearest bfloat16,
    q = x / scale rounded to nearest even, within +-127. int16: scale = largest |x| /
    i16_row_limit(head_dim) rounded up to a bfloat16, q = x / scale to nearest even (within
    the limit; NaN values become 0, a row holding inf gets an infinite scale and reads back
    as NaN)."""
    x = x.astype(np.float32, copy=False)
    if element not in _ROWS:
        raise ValueError(f"cache rows: expected element 'int8' or 'int16', got {element!r}")
    limit = np.float32(_QMAX if element == "int8" else i16_row_limit(x.shape[-1]))
    with np.errstate(invalid="ignore"):
        # fmax from 0: NaN ignored, as the kernel's comparisons ignore it
        top = np.fmax.reduce(np.abs(x), axis=-1, keepdims=True, initial=0.0)
        exact = (top / limit).astype(np.float32)
    bits = _bfloat16_bits(exact, up=element == "int16")
    scales = (bits.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(invalid="ignore"):
        q = np.divide(x, scales, out=np.zeros_like(x), where=scales > 0)
    q = np.nan_to_num(np.clip(np.rint(q), -limit, limit), nan=0.0)
    if element == "int8":
        return np.concatenate([q.astype(np.int8), bits.view(np.int8)], axis=-1)
    return np.concatenate([q.astype(np.int16), bits.view(np.int16)], axis=-1)


def rows_shifted(rows: np.ndarray, shift: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`shift` (a key rotation on float rows) applied to cache rows of any element type:
    int8 and int16 rows are read as floats, rotated, and quantized again."""
    if rows.dtype.name not in _ROWS:
        return shift(rows)
    return float_to_rows(shift(rows_to_float(rows)), rows.dtype.name)
