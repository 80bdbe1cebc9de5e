"""The JSON constraint: only tokens that keep the output a valid JSON prefix survive.

Two levels:

- :class:`JsonConstraint` recognizes text: ``advance(text)`` commits text (raising
  :class:`ConstraintError` when it breaks the value), ``accepts(text)`` asks without
  committing, ``complete`` / ``closed`` tell where the value stands, and
  ``allowed_mask(token_texts)`` gives the tokens that may come next.
- :class:`TokenConstraint` follows one request's generated ids (``sync``) over a
  tokenizer's token texts; its ``apply`` is the ``json_constraint`` logit processor
  (``make_logits_processors(options, constraint=...)``), which sets every other token to
  -inf after the penalties and before temperature / top-k / top-p / min-p.

The rules of a constrained generation (ENGINE_SPEC section 3):

- EOS (the request's end ids) is allowed only once the value is complete; other special
  tokens and tokens with empty text never are.
- When the value is *closed* (an object, array, string or literal ended; a top-level
  number ends at whitespace or EOS), generation ends with finish reason
  ``json_complete`` (the closing token is kept; the worker reports it as a natural stop).
- Stop sequences are deferred until the value is complete and never cut it
  (``StopChecker.check_constrained``).
- Ending on ``max_tokens`` or ``length`` with an incomplete value raises
  :class:`ConstraintError` ("stopped before a complete JSON value"), never a silently
  truncated result; a cancelled request keeps its partial text.
- Whitespace runs between JSON tokens are capped at 32 characters by the masks, and
  nesting at 20 levels (``engine.json_grammar``); text with longer runs is still valid.

Masks are cached per recognizer state and computed on a miss by walking a trie of the
token texts (``engine.constraint_index``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from engine.config import GenerateOptions, JsonConstraintSpec
from engine.constraint_index import Allowed, TokenIndex, grammar_for, index_for
from engine.errors import ConstraintError
from engine.json_grammar import WS, State, closed, complete, initial, step
from engine.json_schema import compile_spec
from engine.logits import ProcessorContext
from engine.stopping import FinishReason

__all__ = [
    "ConstraintError",
    "JsonConstraint",
    "TokenConstraint",
    "check_constrained_finish",
    "ensure_constrained_finish",
]

_LIMIT_KINDS = ("max_tokens", "length")
_WS_CHARS = "".join(WS)
#: Where a constraint stands: (state, characters committed, trailing whitespace run).
Position = tuple[State, int, int]


class JsonConstraint:
    """An incremental recognizer of one JSON value (any value, or ``spec``'s schema)."""

    def __init__(self, spec: JsonConstraintSpec | None = None) -> None:
        self.spec = spec or JsonConstraintSpec()
        self._grammar = grammar_for(compile_spec(self.spec))
        self._state: State = initial(self._grammar.root)
        self._chars = 0
        self._ws_run = 0

    @property
    def state(self) -> State:
        """The recognizer state (immutable)."""
        return self._state

    @property
    def position(self) -> Position:
        """Everything to :meth:`restore` later (a rewind)."""
        return self._state, self._chars, self._ws_run

    def restore(self, position: Position) -> None:
        self._state, self._chars, self._ws_run = position

    @property
    def chars(self) -> int:
        """Characters committed so far."""
        return self._chars

    @property
    def complete(self) -> bool:
        """The committed text is a whole JSON value (a number may still grow)."""
        return complete(self._state)

    @property
    def closed(self) -> bool:
        """The value ended; only whitespace may follow."""
        return closed(self._state)

    def _run(self, text: str) -> State | None:
        state = self._state
        for ch in text:
            nxt = step(state, ch)
            if nxt is None:
                return None
            state = nxt
        return state

    def accepts(self, text: str) -> bool:
        """Whether ``text`` may follow what was committed (commits nothing)."""
        return self._run(text) is not None

    def completes(self, text: str) -> bool:
        """Whether what was committed plus ``text`` is a complete value."""
        state = self._run(text)
        return state is not None and complete(state)

    def advance(self, text: str) -> None:
        """Commit ``text``; raises ConstraintError when it does not continue the value."""
        state = self._run(text)
        if state is None:
            raise ConstraintError(
                f"{text!r} does not continue the JSON value after {self._chars} characters",
                hint="sample from the constrained logits (a custom sampler must respect the "
                "-inf mask)")
        self._state = state
        self._chars += len(text)
        kept = len(text.rstrip(_WS_CHARS))
        self._ws_run = self._ws_run + len(text) if kept == 0 else len(text) - kept

    def allowed(self, index: TokenIndex) -> Allowed:
        """The tokens of ``index`` that may come next."""
        return self._grammar.allowed(index, self._state, self._ws_run)

    def allowed_mask(self, token_texts: Sequence[str],
                     banned_ids: Collection[int] = ()) -> np.ndarray:
        """A read-only bool mask over ``token_texts``: the tokens whose whole text keeps
        the output a valid prefix. End-of-text tokens are not included (see
        :class:`TokenConstraint`); ``banned_ids`` are never allowed."""
        return self.allowed(index_for(token_texts, banned_ids)).mask


class TokenConstraint:
    """A JSON constraint over a vocabulary, following one request's generated ids.

    ``end_ids`` (the request's EOS ids) are allowed only when the value is complete;
    ``banned_ids`` (special tokens) never. Rewinds are followed: ``sync`` with fewer ids
    restores the state after that many tokens.
    """

    def __init__(self, spec: JsonConstraintSpec, token_texts: Sequence[str], *,
                 end_ids: Collection[int] = (), banned_ids: Collection[int] = ()) -> None:
        self.json = JsonConstraint(spec)
        self._texts = token_texts
        self._end = frozenset(end_ids)
        self._index = index_for(token_texts, frozenset(banned_ids) | self._end)
        self._end_array = np.array(sorted(self._end), dtype=np.intp)
        #: (position, ended) after 0, 1, 2, ... synced tokens.
        self._history: list[tuple[Position, bool]] = [(self.json.position, False)]
        self._ended = False

    @property
    def complete(self) -> bool:
        return self.json.complete

    @property
    def closed(self) -> bool:
        """Generation is over: the value closed, or an end id followed a complete value."""
        return self._ended or self.json.closed

    def sync(self, generated_ids: Sequence[int]) -> None:
        """Catch up with ``generated_ids`` (advance over new ids, or rewind)."""
        synced = len(self._history) - 1
        count = len(generated_ids)
        if count < synced:
            del self._history[count + 1:]
            position, self._ended = self._history[-1]
            self.json.restore(position)
            return
        for token in generated_ids[synced:]:
            self._accept(int(token))
            self._history.append((self.json.position, self._ended))

    def _accept(self, token: int) -> None:
        if self._ended:
            raise ConstraintError("a token followed the end of the JSON value",
                                  hint="stop generating once the constraint is closed")
        if token in self._end:
            if not self.json.complete:
                raise ConstraintError("EOS came before a complete JSON value",
                                      hint="a custom sampler must respect the -inf mask")
            self._ended = True
            return
        if not 0 <= token < len(self._texts):
            raise ConstraintError(f"token {token} is outside the constraint's vocabulary of "
                                  f"{len(self._texts)} tokens",
                                  hint="use the model's own tokenizer")
        self.json.advance(self._texts[token])

    def allowed(self) -> Allowed:
        """The tokens allowed next (end ids included when the value is complete)."""
        base = self.json.allowed(self._index)
        if not self._end or not self.json.complete:
            return base
        mask = base.mask.copy()
        mask[self._end_array[self._end_array < mask.shape[0]]] = True
        return Allowed(mask)

    def apply(self, logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        """The ``json_constraint`` processor: every disallowed token to -inf."""
        self.sync(context.generated_ids)
        allowed = self.allowed()
        size = logits.shape[0]
        prior = context.support_of(logits)
        ids = allowed.ids
        if ids is None and prior is not None:
            ids = np.flatnonzero(allowed.mask)
        if ids is not None:
            if prior is not None:
                ids = np.intersect1d(ids, prior, assume_unique=True)
            if ids.size and ids[-1] >= size:
                ids = ids[ids < size]
            out = np.full_like(logits, -np.inf)
            out[ids] = logits[ids]
            context.set_support(out, ids)
            return out
        mask = allowed.mask
        if mask.shape[0] != size:
            fitted = np.zeros(size, dtype=bool)
            common = min(size, mask.shape[0])
            fitted[:common] = mask[:common]
            mask = fitted
        out = np.where(mask, logits, logits.dtype.type(-np.inf))
        context.set_support(out, None)
        return out


def check_constrained_finish(reason: FinishReason, is_complete: bool) -> None:
    """Raise ConstraintError when a constrained generation ends on a limit mid-value."""
    if is_complete or reason.kind not in _LIMIT_KINDS:
        return
    limit = "max_new_tokens" if reason.kind == "max_tokens" else "the context length"
    raise ConstraintError(
        f"the generation stopped before a complete JSON value: it reached {limit} "
        f"(finish reason {reason}) in the middle of the value",
        hint="raise max_new_tokens (max_tokens), or ask for a shorter answer")


def ensure_constrained_finish(options: GenerateOptions, text: str,
                              reason: FinishReason) -> None:
    """The seed's check on a finished text: with ``options.constraint``, a ``max_tokens``
    or ``length`` finish needs ``text`` to be a complete value."""
    if options.constraint is None:
        return
    check_constrained_finish(reason, JsonConstraint(options.constraint).completes(text))
