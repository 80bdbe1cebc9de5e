"""What batched and speculative decoding promise against a request run alone
(docs/kv-and-scheduling.md, "Scheduler"; docs/speculative.md):

- fp32 graphs: the same tokens, always (the tests compare them exactly).
- int4 ``MatMulNBits`` graphs on the engine's kernels (engine/kernels: every attention and
  4-bit matmul node moved, :func:`exact_paths`): the same tokens and log-probabilities, bit
  for bit, as each row is computed the same way whatever the rows beside it.
- int4 graphs on ONNX Runtime's kernels (turned off, not built, a GPU): ONNX Runtime may
  take another kernel for a step of several rows (a batch, a verify pass) than for one row,
  and int4 rounding then moves a token's log-probability a little (up to ~0.2 measured on
  the forged int4 models). The tokens are the solo ones up to the first step where the solo
  run's best two were that close; there the other run took a token the solo run found
  almost as likely, and the two answers go on as two greedy continuations.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine import Engine, GenerateResult
from engine.generation.sampling import TokenLogprob

#: The most a token's log-probability may move between a batched or verified step and the
#: solo one on an int4 graph.
INT4_NOISE = 0.5
#: Solo's best token and the one taken instead are at most this far apart (log-probability)
#: where an int4 answer leaves the solo one: twice the noise, a near-tie.
NEAR_TIE = 2 * INT4_NOISE


def exact_paths(engine: Engine) -> bool:
    """Whether every GroupQueryAttention and MatMulNBits node of `engine` runs the engine's
    kernels: then a batched or verified step gives each row the bits of a solo step."""
    return engine.exact_paths


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the two token lists differ (None when they are equal)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_follows_solo_up_to_a_near_tie(solo: GenerateResult, tokens: Sequence[int],
                                         logprobs: Sequence[TokenLogprob] = ()) -> int | None:
    """``tokens`` (with their ``logprobs``, when the run kept them) against ``solo`` (run
    with ``top_logprobs`` >= 5): the same up to a near-tie of the solo run, the same
    log-probabilities within INT4_NOISE up to there. Returns where they part (or None)."""
    k = first_divergence(solo.token_ids, tokens)
    assert len(tokens) == len(solo.token_ids), (len(tokens), len(solo.token_ids))
    for step, (mine, theirs) in enumerate(zip(solo.logprobs[:k], logprobs[:k], strict=False)):
        shared = dict(mine.top).keys() & dict(theirs.top).keys()
        assert mine.token_id in shared, step
        for token in shared:
            moved = abs(dict(mine.top)[token] - dict(theirs.top)[token])
            assert moved <= INT4_NOISE, (step, token, moved)
    if k is None:
        return None
    best = dict(solo.logprobs[k].top)
    taken = tokens[k]
    assert taken in best, f"step {k}: token {taken} is not among the solo run's best {best}"
    gap = best[solo.token_ids[k]] - best[taken]
    assert 0 <= gap <= NEAR_TIE, f"step {k}: not a near-tie ({gap:.3f} apart)"
    return k
