"""Pure logit processors, built once per request by :func:`make_logits_processors`.

The chain runs in this order (each step only when its option is set):

1. ``logit_bias``          add OpenAI ``logit_bias`` to the listed token ids
2. ``repetition_penalty``  HF/CTRL: over the distinct tokens of prompt + generated, positive
                           logits are divided by the penalty and negative ones multiplied
3. ``frequency_penalty``   OpenAI: ``logit -= count(token in generated) * penalty``
4. ``presence_penalty``    OpenAI: ``logit -= penalty`` for every token seen in generated
5. ``stop_sequence``       mask EOS / single-token stops to -inf while fewer than
                           ``min_new_tokens`` tokens were generated
   ``constraint``          with ``options.constraint``: -inf for every token the grammar
                           (JSON, a schema, GBNF, a regex) does not allow next
                           (``engine.generation.guidance``)
6. ``temperature``         divide by the temperature (never for greedy, nor for 1)
7. ``top_k``               keep the k largest logits
8. ``top_p``               keep the smallest most-probable set whose mass is >= p
9. ``min_p``               drop tokens whose probability is < min_p * the top probability

Default options give an empty chain. Greedy keeps top_k/top_p/min_p if set: they never
change the argmax.

Ownership: a processor (and :func:`apply_processors`) takes ownership of the logits it is
given: it may modify that array in place and may return it or a new array. Pass a copy if
the raw logits are still needed. ``apply_processors`` copies only inputs it cannot write
(read-only, non-float or non-contiguous).

Incremental state: :class:`ProcessorContext` keeps per-token tallies (distinct ids and
counts) that are updated by ``append`` in O(1), built lazily on first use, so penalties
cost O(distinct tokens), never a recount of the history. It also carries a per-step
support hint: top_k / top_p / min_p record which ids survive, so the next truncation step
and the sampler look only at those candidates instead of the whole vocabulary. A custom
processor placed after them may mask more tokens but must not unmask any.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from engine.config import GenerateOptions
from engine.errors import InvalidOptionError
from engine.generation.context import (
    ConstraintProcessor,
    NamedProcessor,
    Processor,
    ProcessorContext,
    nan_logits_error,
)


def checked_max(values: np.ndarray) -> float:
    """The largest value (-inf when empty); raises the NaN error if any value is NaN."""
    if values.size == 0:
        return -math.inf
    top = float(values.max())
    if top != top:
        raise nan_logits_error()
    return top


def shifted_exp(values: np.ndarray, top: float) -> np.ndarray:
    """``exp(values - top)``: unnormalised probabilities; +inf logits share all the mass."""
    if top == math.inf:
        return (values == math.inf).astype(np.float32)
    weights = values - values.dtype.type(top)
    return np.exp(weights, out=weights)  # in place: one fresh array, not two


def top_k_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the ``k`` largest values above -inf (fewer if fewer are finite).

    Ties at the boundary go to the lower index. Runs in O(n) without sorting the whole
    array: the k-th largest of >= 4k disjoint group maxima bounds the answer from below,
    so only the few values above it are partitioned. Raises the NaN error on NaN.
    """
    n = values.shape[0]
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    rows = n // max(4 * k, 512)
    if rows >= 4:
        cols = n // rows
        maxima = values[: rows * cols].reshape(rows, cols).max(axis=0)
        if rows * cols < n:
            maxima = np.concatenate((maxima, values[rows * cols :]))
        checked_max(maxima)
        floor = np.partition(maxima, maxima.size - k)[maxima.size - k]
        cand = np.flatnonzero(values >= floor if floor > -np.inf else values > -np.inf)
    else:
        checked_max(values)
        cand = np.flatnonzero(values > -np.inf)
    if cand.size <= k:
        return cand
    cand_values = values[cand]
    kth = np.partition(cand_values, cand.size - k)[cand.size - k]
    keep = cand_values > kth
    need = k - int(np.count_nonzero(keep))
    if need > 0:
        keep[np.flatnonzero(cand_values == kth)[:need]] = True
    return cand[keep]


def _candidates(
    logits: np.ndarray, context: ProcessorContext
) -> tuple[np.ndarray | None, np.ndarray]:
    ids = context.support_of(logits)
    return ids, (logits if ids is None else logits[ids])


def _restrict(
    logits: np.ndarray, ids: np.ndarray | None, keep: np.ndarray, context: ProcessorContext
) -> np.ndarray:
    """A fresh array holding ``logits`` at the kept (ascending, local) indices, -inf elsewhere."""
    kept = keep if ids is None else ids[keep]
    out = np.full_like(logits, -np.inf)
    out[kept] = logits[kept]
    context.set_support(out, kept)
    return out


def _restrict_mask(
    logits: np.ndarray, ids: np.ndarray | None, mask: np.ndarray, context: ProcessorContext
) -> np.ndarray:
    """Like :func:`_restrict` for a boolean mask over the candidates; a big survivor set is
    cheaper to write with one ``where`` pass than by index (and is no useful hint)."""
    if ids is None and 8 * int(np.count_nonzero(mask)) > mask.size:
        out = np.where(mask, logits, logits.dtype.type(-np.inf))
        context.set_support(out, None)
        return out
    return _restrict(logits, ids, np.flatnonzero(mask), context)


def _make_logit_bias(bias: dict[int, float]) -> Processor:
    ids = np.fromiter(bias.keys(), dtype=np.intp, count=len(bias))
    values = np.fromiter(bias.values(), dtype=np.float64, count=len(bias))
    largest = int(ids.max())

    def logit_bias(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        if largest >= logits.shape[0]:
            raise InvalidOptionError(
                "logit_bias", f"token id {largest} is outside the vocabulary of "
                f"{logits.shape[0]} tokens", hint="use token ids of this model's tokenizer")
        logits[ids] += values
        return logits

    return logit_bias


def _make_repetition_penalty(penalty: float) -> Processor:
    def repetition_penalty(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        ids = context.seen_ids()
        if ids.size:
            seen = logits[ids]
            logits[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
        return logits

    return repetition_penalty


def _make_frequency_penalty(penalty: float) -> Processor:
    def frequency_penalty(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        ids, counts = context.generated_counts()
        if ids.size:
            logits[ids] -= counts * penalty
        return logits

    return frequency_penalty


def _make_presence_penalty(penalty: float) -> Processor:
    def presence_penalty(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        ids, _ = context.generated_counts()
        if ids.size:
            logits[ids] -= penalty
        return logits

    return presence_penalty


def _make_stop_mask(token_ids: Collection[int], min_new_tokens: int) -> Processor:
    ids = np.array(sorted(set(token_ids)), dtype=np.intp)

    def stop_sequence(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        if len(context.generated_ids) < min_new_tokens:
            # Ids beyond the logits (a tokenizer-only EOS) can never be sampled anyway.
            logits[ids if ids[-1] < logits.shape[0] else ids[ids < logits.shape[0]]] = -np.inf
        return logits

    return stop_sequence


def _make_temperature(temperature: float) -> Processor:
    inverse = 1.0 / temperature

    def temperature_(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        np.multiply(logits, logits.dtype.type(inverse), out=logits)
        return logits

    return temperature_


def _make_top_k(k: int) -> Processor:
    def top_k(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        ids, values = _candidates(logits, context)
        if values.shape[0] <= k:
            return logits
        return _restrict(logits, ids, top_k_indices(values, k), context)

    return top_k


_SORT_AT_MOST = 1024
_BUCKETS_PER_NAT = 16
_BUCKETS = 512


def _sorted_prefix(cand: np.ndarray, weights: np.ndarray, target: float) -> np.ndarray:
    """The heaviest members of ``cand`` (ties: lower index) whose mass first reaches target."""
    cand_weights = weights[cand]
    order = np.argsort(-cand_weights, kind="stable")
    mass = np.cumsum(cand_weights[order], dtype=np.float64)
    count = min(int(np.searchsorted(mass, target, side="left")) + 1, cand.size)
    return cand[order[:count]]


def _nucleus_by_buckets(
    values: np.ndarray, weights: np.ndarray, target: float, top: float
) -> np.ndarray:
    """A mask of the nucleus without a full sort: bucket by distance from the top logit,
    sum the mass per bucket, keep the buckets before the one where the target is reached,
    and sort only that boundary bucket."""
    distance = (values.dtype.type(top) - values) * values.dtype.type(_BUCKETS_PER_NAT)
    np.minimum(distance, _BUCKETS - 1, out=distance)  # also maps -inf logits to the last
    # float -> int32 -> intp is several times faster than either direct cast, and
    # bincount is several times slower on int32 input.
    bucket = distance.astype(np.int32).astype(np.intp)
    mass = np.cumsum(np.bincount(bucket, weights=weights, minlength=_BUCKETS))
    edge = min(int(np.searchsorted(mass, target, side="left")), _BUCKETS - 1)
    below = float(mass[edge - 1]) if edge else 0.0
    mask = bucket < edge
    mask[_sorted_prefix(np.flatnonzero(bucket == edge), weights, target - below)] = True
    return mask


def _make_top_p(p: float) -> Processor:
    def top_p(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        ids, values = _candidates(logits, context)
        top = checked_max(values)
        if top == -math.inf:
            return logits
        weights = shifted_exp(values, top)
        total = float(weights.sum(dtype=np.float64))
        target = p * total
        n = values.shape[0]
        # Tokens lighter than (1 - p) * total / n hold less than (1 - p) of the mass all
        # together, so the nucleus lies among the heavier ones.
        heavy = weights >= (1.0 - p) * total / n
        count = int(np.count_nonzero(heavy))
        if count <= _SORT_AT_MOST:
            keep = np.sort(_sorted_prefix(np.flatnonzero(heavy), weights, target))
            return logits if keep.size == n else _restrict(logits, ids, keep, context)
        if 4 * count <= n:
            cand = np.flatnonzero(heavy)
            keep = cand[_nucleus_by_buckets(values[cand], weights[cand], target, top)]
            return _restrict(logits, ids, keep, context)
        return _restrict_mask(logits, ids, _nucleus_by_buckets(values, weights, target, top),
                              context)

    return top_p


def _make_min_p(min_p: float) -> Processor:
    log_min_p = math.log(min_p)

    def min_p_(logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        ids, values = _candidates(logits, context)
        top = checked_max(values)
        if top == -math.inf:
            return logits
        # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p): no softmax needed.
        keep = values >= top + log_min_p
        if np.all(keep):
            return logits
        return _restrict_mask(logits, ids, keep, context)

    return min_p_


def make_logits_processors(
    options: GenerateOptions, *, stop_token_ids: Collection[int] = (),
    constraint: ConstraintProcessor | None = None,
) -> list[NamedProcessor]:
    """The processor chain for ``options`` in the documented order (empty for defaults).

    ``stop_token_ids`` are the ids masked while ``min_new_tokens`` is not reached: the
    EOS ids plus single-token stop sequences. ``constraint`` is required with
    ``options.constraint``: it holds the request's grammar matcher and follows its
    tokens.
    """
    chain: list[NamedProcessor] = []

    def add(name: str, apply: Processor) -> None:
        chain.append(NamedProcessor(name, apply))

    if options.logit_bias:
        add("logit_bias", _make_logit_bias(dict(options.logit_bias)))
    if options.repetition_penalty != 1.0:
        add("repetition_penalty", _make_repetition_penalty(options.repetition_penalty))
    if options.frequency_penalty != 0.0:
        add("frequency_penalty", _make_frequency_penalty(options.frequency_penalty))
    if options.presence_penalty != 0.0:
        add("presence_penalty", _make_presence_penalty(options.presence_penalty))
    if options.min_new_tokens > 0 and stop_token_ids:
        add("stop_sequence", _make_stop_mask(stop_token_ids, options.min_new_tokens))
    if constraint is not None:
        add("constraint", constraint.apply)
    elif options.constraint is not None:
        raise InvalidOptionError(
            "constraint", "a constraint needs its matcher over the model's tokenizer",
            hint="pass constraint=TokenConstraint(options.constraint, tokenizer, vocab_size)")
    if not options.is_greedy and options.temperature != 1.0:
        add("temperature", _make_temperature(options.temperature))
    if options.top_k > 0:
        add("top_k", _make_top_k(options.top_k))
    if options.top_p < 1.0:
        add("top_p", _make_top_p(options.top_p))
    if options.min_p > 0.0:
        add("min_p", _make_min_p(options.min_p))
    return chain


def apply_processors(
    logits: np.ndarray, chain: Sequence[NamedProcessor], context: ProcessorContext
) -> np.ndarray:
    """Run ``chain`` over 1-D ``logits``; takes ownership of ``logits`` (see module doc)."""
    context.set_support(logits, None)
    if not chain:
        return logits
    if logits.ndim != 1:
        raise ValueError(f"expected 1-D logits (one row of the vocabulary), got {logits.shape}")
    if (
        logits.dtype not in (np.float32, np.float64)
        or not logits.flags.writeable
        or not logits.flags.c_contiguous
    ):
        logits = np.array(logits, dtype=np.float32)
    for processor in chain:
        logits = processor.apply(logits, context)
    return logits
