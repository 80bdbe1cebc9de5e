"""What logit processors share: the per-request :class:`ProcessorContext` (incremental
token tallies and the support hint; see ``engine.generation.logits``), the processor types,
and the errors a step raises when no token is left to pick."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from engine.errors import EngineError


def nan_logits_error() -> EngineError:
    return EngineError(
        "the model produced NaN logits",
        hint="the model or its inputs are broken (overflow in float16?); try float32 or CPU",
    )


def all_masked_error() -> EngineError:
    return EngineError(
        "every token was masked out (all logits are -inf); nothing can be sampled",
        hint="check logit_bias, the constraint and min_new_tokens against this vocabulary",
    )


class _Tally:
    """Distinct token ids (in first-seen order) and their counts; O(1) amortised per add."""

    def __init__(self, initial: np.ndarray) -> None:
        self.counts = np.bincount(initial, minlength=1024).astype(np.int64)
        first = np.flatnonzero(self.counts)
        self._ids = np.empty(max(256, 2 * first.size), dtype=np.intp)
        self._ids[: first.size] = first
        self._n = int(first.size)

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self._n]

    def add(self, token: int) -> None:
        if token >= self.counts.shape[0]:
            grown = np.zeros(max(token + 1, 2 * self.counts.shape[0]), dtype=np.int64)
            grown[: self.counts.shape[0]] = self.counts
            self.counts = grown
        before = self.counts[token]
        self.counts[token] = before + 1
        if before == 0:
            if self._n == self._ids.shape[0]:
                self._ids = np.concatenate((self._ids, np.empty_like(self._ids)))
            self._ids[self._n] = token
            self._n += 1

    def remove(self, tokens: Sequence[int]) -> None:
        np.subtract.at(self.counts, np.asarray(tokens, dtype=np.intp), 1)
        alive = self.ids[self.counts[self.ids] > 0]
        self._n = int(alive.size)
        self._ids[: self._n] = alive


@dataclass(eq=False)
class ProcessorContext:
    """What processors may read besides the logits; one per request.

    Grow ``generated_ids`` through :meth:`append` / :meth:`extend` (plain ``list.append``
    also works) and shrink it only through :meth:`truncate`.
    """

    prompt_ids: Sequence[int] = ()
    generated_ids: list[int] = field(default_factory=list)
    _all: _Tally | None = field(default=None, init=False, repr=False)
    _gen: _Tally | None = field(default=None, init=False, repr=False)
    _folded: int = field(default=0, init=False, repr=False)
    _support: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    def append(self, token_id: int) -> None:
        self.generated_ids.append(token_id)

    def extend(self, token_ids: Sequence[int]) -> None:
        self.generated_ids.extend(token_ids)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` generated tokens (speculative rewind)."""
        assert 0 <= length <= len(self.generated_ids), (length, len(self.generated_ids))
        self._sync()
        dropped = self.generated_ids[length:]
        if dropped and self._all is not None and self._gen is not None:
            self._all.remove(dropped)
            self._gen.remove(dropped)
        del self.generated_ids[length:]
        self._folded = length

    def _sync(self) -> None:
        if self._all is None or self._gen is None:
            return
        assert len(self.generated_ids) >= self._folded, "shrink generated_ids via truncate()"
        pending = self.generated_ids[self._folded :]
        for token in pending:
            self._all.add(token)
            self._gen.add(token)
        self._folded = len(self.generated_ids)

    def _tallies(self) -> tuple[_Tally, _Tally]:
        if self._all is None or self._gen is None:
            prompt = np.asarray(self.prompt_ids, dtype=np.intp).reshape(-1)
            self._all = _Tally(prompt)
            self._gen = _Tally(np.zeros(0, dtype=np.intp))
            self._folded = 0
        self._sync()
        return self._all, self._gen

    def seen_ids(self) -> np.ndarray:
        """Distinct token ids of prompt + generated (for the repetition penalty)."""
        return self._tallies()[0].ids

    def generated_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct generated ids and how often each was generated."""
        gen = self._tallies()[1]
        ids = gen.ids
        return ids, gen.counts[ids]

    def support_of(self, logits: np.ndarray) -> np.ndarray | None:
        """Ascending ids outside which ``logits`` is all -inf, if a truncation recorded them."""
        if self._support is not None and self._support[0] is logits:
            return self._support[1]
        return None

    def set_support(self, logits: np.ndarray, ids: np.ndarray | None) -> None:
        self._support = None if ids is None else (logits, ids)


Processor = Callable[[np.ndarray, ProcessorContext], np.ndarray]


class ConstraintProcessor(Protocol):
    """A request's grammar matcher as the chain sees it (``engine.generation.guidance``'s
    ``TokenConstraint``): its ``apply`` masks what the grammar does not allow next."""

    def apply(self, logits: np.ndarray, context: ProcessorContext) -> np.ndarray: ...


@dataclass(frozen=True)
class NamedProcessor:
    name: str
    apply: Processor
