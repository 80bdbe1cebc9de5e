"""Constrained output on llguidance: JSON, JSON Schema, GBNF/Lark grammars and regexes.

The grammar of a :class:`~engine.constraint.ConstraintSpec` comes from
``engine.constraint``. :class:`TokenConstraint` follows one request's generated
ids with an ``llguidance.LLMatcher`` over the model's tokenizer (built once per tokenizer from its
``tokenizer.json``) and its ``apply`` is the ``constraint`` logit processor, which sets
every token the grammar does not allow next to -inf (after the penalties, before
temperature / top-k / top-p / min-p).

The rules of a constrained generation:

- The request's end ids (EOS) are allowed only where the grammar accepts the text so far;
  special tokens the grammar does not name (by id, ``<[id]>``) never are.
- When the grammar can take nothing more (an object closed, a regex matched to its end),
  generation ends with finish reason ``json_complete`` (the worker reports a natural
  stop); a top-level number stays open until EOS.
- Stop sequences are deferred until the text is accepted and never cut it.
- A limit (``max_tokens``, the context) mid-value ends the answer as any other: the text
  so far, finish reason ``max_tokens`` / ``length`` (OpenAI's ``"length"``).
- JSON is compact: no whitespace between tokens (``"x-guidance": {"whitespace_flexible":
  true}`` in a schema allows it); weak models otherwise fill the budget with blanks.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import llguidance
import numpy as np

from engine.constraint import ConstraintSpec, grammar_of
from engine.errors import ConstraintError, InvalidOptionError

if TYPE_CHECKING:

    from engine.generation.logits import ProcessorContext
    from engine.text.tokenizer import Tokenizer

__all__ = ["ConstraintError", "TokenConstraint", "grammar_of", "guidance_tokenizer"]

_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, dict[int, llguidance.LLTokenizer]] = (
    weakref.WeakKeyDictionary())
_TOKENIZERS_LOCK = threading.Lock()


def guidance_tokenizer(tokenizer: Tokenizer, n_vocab: int) -> llguidance.LLTokenizer:
    """llguidance's view of ``tokenizer`` for logits of width ``n_vocab`` (built once: a
    32k vocabulary takes a few hundred ms)."""
    with _TOKENIZERS_LOCK:
        per = _TOKENIZERS.setdefault(tokenizer, {})
        found = per.get(n_vocab)
        if found is None:
            eos = list(tokenizer.eos_token_ids) or None
            found = per[n_vocab] = llguidance.LLTokenizer(
                tokenizer.backend_json(), n_vocab=n_vocab, eos_token=eos)
        return found


def _named_tokens(spec: ConstraintSpec) -> set[int]:
    """Token ids a Lark grammar names (``<[id]>``): special tokens it may emit."""
    if spec.kind != "grammar" or not spec.text:
        return set()
    return {int(m) for m in re.findall(r"<\[(\d+)\]>", spec.text)}


class TokenConstraint:
    """One request's matcher: follows its generated ids (``sync``, rewinds included) and
    masks the logits. ``end_ids`` (the request's EOS ids) are allowed only where the
    grammar accepts; ``banned_ids`` (special tokens) never, unless the grammar asks."""

    def __init__(self, spec: ConstraintSpec, tokenizer: Tokenizer, n_vocab: int, *,
                 end_ids: Collection[int] = (), banned_ids: Collection[int] = ()) -> None:
        self.spec = spec
        self._n = n_vocab
        lltok = guidance_tokenizer(tokenizer, n_vocab)
        started = time.perf_counter()
        self._matcher = llguidance.LLMatcher(lltok, grammar_of(spec), log_level=0)
        #: Seconds to compile the grammar against the vocabulary.
        self.compile_s = time.perf_counter() - started
        if self._matcher.is_error():
            raise InvalidOptionError("constraint", f"llguidance refused the grammar: "
                                     f"{self._matcher.get_error()}")
        self._end = np.array(sorted({i for i in end_ids if 0 <= i < n_vocab}), dtype=np.intp)
        self._end_set = frozenset(int(i) for i in self._end)
        named = _named_tokens(spec)
        never = {i for i in (*banned_ids, *lltok.eos_tokens) if 0 <= i < n_vocab} - named
        self._never = np.array(sorted(never), dtype=np.intp)
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self._consumed: list[int] = []
        self._ended = False
        #: Seconds of each mask computed (bench/constraint.py reads them).
        self.mask_s: list[float] = []

    @property
    def complete(self) -> bool:
        """The text so far is a whole answer (EOS may follow)."""
        return self._ended or self._matcher.is_accepting()

    @property
    def closed(self) -> bool:
        """Nothing can follow: the grammar ended, or an end id followed a whole answer."""
        return self._ended or self._matcher.is_stopped()

    def sync(self, generated_ids: Sequence[int]) -> None:
        """Catch up with ``generated_ids`` (advance over new ids, or rewind)."""
        synced = len(self._consumed) + self._ended
        count = len(generated_ids)
        if count < synced:
            back = synced - count
            if self._ended:
                self._ended, back = False, back - 1
            if back:
                self._matcher.rollback(back)
                del self._consumed[-back:]
            return
        for token in generated_ids[synced:]:
            self._accept(int(token))

    def _accept(self, token: int) -> None:
        if self._ended or self._matcher.is_stopped():
            raise ConstraintError("a token followed the end of the constrained answer",
                                  hint="stop generating once the constraint is closed")
        if token in self._end_set:
            if not self._matcher.is_accepting():
                raise ConstraintError("EOS came before the constrained answer was complete",
                                      hint="a custom sampler must respect the -inf mask")
            self._ended = True
            return
        if not self._matcher.consume_token(token):
            raise ConstraintError(
                f"token {token} does not continue the constrained answer after "
                f"{len(self._consumed)} tokens ({self._matcher.get_error()})",
                hint="sample from the constrained logits (a custom sampler must respect "
                "the -inf mask)")
        self._consumed.append(token)

    def mask(self) -> np.ndarray:
        """Bool mask over the vocabulary: the tokens allowed next."""
        started = time.perf_counter()
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._n]
        allowed = mask.astype(bool)
        allowed[self._never] = False
        if self._end.size and self._matcher.is_accepting():
            allowed[self._end] = True
        self.mask_s.append(time.perf_counter() - started)
        return allowed

    def apply(self, logits: np.ndarray, context: ProcessorContext) -> np.ndarray:
        """The ``constraint`` processor: every disallowed token to -inf."""
        self.sync(context.generated_ids)
        mask = self.mask()
        size = logits.shape[0]
        if mask.shape[0] != size:
            fitted = np.zeros(size, dtype=bool)
            common = min(size, mask.shape[0])
            fitted[:common] = mask[:common]
            mask = fitted
        prior = context.support_of(logits)
        if prior is not None:
            ids = prior[mask[prior]]
            out = np.full_like(logits, -np.inf)
            out[ids] = logits[ids]
            context.set_support(out, ids)
            return out
        out = np.where(mask, logits, logits.dtype.type(-np.inf))
        context.set_support(out, None)
        return out
