"""Samplers (greedy, seeded categorical) and logprobs over processed logits.

Samplers are called with the logits the processor chain produced (see ``engine.logits``)
and its :class:`ProcessorContext`. When a truncation step recorded the surviving ids, a
sampler works on those few candidates only; otherwise greedy costs one argmax and
sampling one exp over the vocabulary plus a two-level inverse CDF (no full cumsum).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from engine.api import CustomSampler as CustomSampler
from engine.api import SamplerContext as SamplerContext
from engine.api import TokenLogprob as TokenLogprob
from engine.config import GenerateOptions
from engine.errors import SamplerError
from engine.generation.context import (
    NamedProcessor,
    ProcessorContext,
    all_masked_error,
    nan_logits_error,
)
from engine.generation.logits import apply_processors, checked_max, shifted_exp, top_k_indices

__all__ = [
    "CategoricalSampler",
    "CustomSampler",
    "CustomSamplerCall",
    "GreedySampler",
    "Sampler",
    "SamplerContext",
    "TokenLogprob",
    "make_sampler",
    "sample_from_probs",
    "select_next_token",
    "token_logprob",
]

#: Above this many entries the inverse CDF goes through block sums first.
_FLAT_CDF_MAX = 4096
_CDF_BLOCK = 256


class Sampler(Protocol):
    name: str

    def __call__(self, logits: np.ndarray, context: ProcessorContext) -> int: ...


def _invert(cdf: np.ndarray, target: float, weights: np.ndarray) -> int:
    index = int(np.searchsorted(cdf, target, side="right"))
    if index >= cdf.shape[0]:  # rounding put the target at the very top
        index = int(np.flatnonzero(weights > 0)[-1])
    return index


def sample_from_probs(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the index whose cumulative mass first exceeds ``u`` * total.

    ``probs`` are non-negative weights (they need not sum to 1); ``u`` is uniform in
    [0, 1). A zero-weight index is never returned.
    """
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be a uniform draw in [0, 1), got {u!r}")
    n = probs.shape[0]
    if n <= _FLAT_CDF_MAX:
        cdf = np.cumsum(probs, dtype=np.float64)
        if not cdf.size or not cdf[-1] > 0:
            raise all_masked_error()
        return _invert(cdf, u * float(cdf[-1]), probs)
    blocks = n // _CDF_BLOCK
    sums = probs[: blocks * _CDF_BLOCK].reshape(blocks, _CDF_BLOCK).sum(axis=1, dtype=np.float64)
    if blocks * _CDF_BLOCK < n:
        sums = np.append(sums, probs[blocks * _CDF_BLOCK :].sum(dtype=np.float64))
    block_cdf = np.cumsum(sums)
    if not block_cdf[-1] > 0:
        raise all_masked_error()
    target = u * float(block_cdf[-1])
    block = _invert(block_cdf, target, sums)
    start = block * _CDF_BLOCK
    inside = probs[start : start + _CDF_BLOCK]
    below = float(block_cdf[block - 1]) if block else 0.0
    return start + _invert(np.cumsum(inside, dtype=np.float64), target - below, inside)


class GreedySampler:
    """The argmax (ties: the lowest id)."""

    name: str = "greedy"

    def __call__(self, logits: np.ndarray, context: ProcessorContext) -> int:
        ids = context.support_of(logits)
        if ids is None:
            index = int(np.argmax(logits))
        elif ids.size:
            index = int(ids[int(np.argmax(logits[ids]))])
        else:
            raise all_masked_error()
        best = float(logits[index])
        if best != best:
            raise nan_logits_error()
        if best == -math.inf:
            raise all_masked_error()
        return index


class CategoricalSampler:
    """A draw from softmax(logits) with its own PCG64 stream: same seed, same tokens."""

    name: str = "categorical"

    def __init__(self, seed: int | None) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def __call__(self, logits: np.ndarray, context: ProcessorContext) -> int:
        ids = context.support_of(logits)
        values = logits if ids is None else logits[ids]
        top = checked_max(values)
        if top == -math.inf:
            raise all_masked_error()
        index = sample_from_probs(shifted_exp(values, top), float(self._rng.random()))
        return index if ids is None else int(ids[index])


class CustomSamplerCall:
    """Adapts a :data:`CustomSampler` to the :class:`Sampler` protocol: builds its context,
    checks what it returns, and turns its failures into :class:`SamplerError`."""

    name: str = "custom"

    def __init__(self, sampler: CustomSampler, prompt_ids: Sequence[int]) -> None:
        self._sampler = sampler
        self._prompt = tuple(prompt_ids)

    def __call__(self, logits: np.ndarray, context: ProcessorContext) -> int:
        step = len(context.generated_ids)
        seen = SamplerContext(self._prompt, tuple(context.generated_ids), step)
        try:
            token = self._sampler(np.array(logits, dtype=np.float32), seen)
        except Exception as exc:
            raise SamplerError(
                f"the custom sampler raised {type(exc).__name__}: {exc} (at step {step})",
                hint="fix the sampler; the request ended, the engine is unaffected") from exc
        vocab = logits.shape[-1]
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)) \
                or not 0 <= int(token) < vocab:
            raise SamplerError(
                f"the custom sampler returned {token!r} at step {step}; expected a token id "
                f"in 0..{vocab - 1}", hint="return an int index into the logits")
        return int(token)


def make_sampler(options: GenerateOptions) -> Sampler:
    """Greedy for ``options.is_greedy``; otherwise categorical, seeded by ``options.seed``
    (None = fresh OS entropy)."""
    if options.is_greedy:
        return GreedySampler()
    return CategoricalSampler(options.seed)


def select_next_token(
    logits: np.ndarray,
    context: ProcessorContext,
    chain: Sequence[NamedProcessor],
    sampler: Sampler,
) -> int:
    """Run the processor chain (taking ownership of ``logits``), then the sampler."""
    return sampler(apply_processors(logits, chain, context), context)


def token_logprob(logits: np.ndarray, token_id: int, top_n: int) -> TokenLogprob:
    """Log-softmax of the PROCESSED ``logits``: ``token_id``'s logprob and the ``top_n`` best.

    Ties in ``top`` are ordered by token id. Does not modify ``logits``.
    """
    top = checked_max(logits)
    if top == -math.inf:
        raise all_masked_error()
    if top == math.inf:  # degenerate: the +inf tokens share all the mass
        inf_count = int(np.count_nonzero(logits == math.inf))
        lse = math.inf
        def logprob_of(value: float) -> float:
            return -math.log(inf_count) if value == math.inf else -math.inf
    else:
        lse = top + math.log(float(shifted_exp(logits, top).sum(dtype=np.float64)))
        def logprob_of(value: float) -> float:
            return value - lse
    best: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        ids = top_k_indices(logits, top_n)
        order = np.argsort(-logits[ids], kind="stable")
        best = tuple((int(i), logprob_of(float(logits[i]))) for i in ids[order])
    return TokenLogprob(int(token_id), logprob_of(float(logits[token_id])), best)
