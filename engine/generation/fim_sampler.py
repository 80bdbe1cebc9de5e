"""The first tokens of a prefix-only answer: spell the healed blanks, then no line break
(nor end-of-text, a special token or the suffix's closing bracket) before the first
visible character. Later tokens are the built-in sampler's (greedy or seeded
categorical over the processed logits), untouched.

The mask must come before truncation (top-k, top-p, min-p would have dropped the second
choice a mask leaves), so the request's own options carry none
(:func:`chain_options`) and this sampler truncates, after masking, with the
caller's values: the same steps in the same order as the built-in chain.

Runs as the request's custom sampler (``GenerateRequest.sampler``), so the rule holds in
every path that generates: ``Engine.stream``, the scheduler, the server.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field, replace

import numpy as np

from engine.config import GenerateOptions
from engine.generation.logits import ProcessorContext, apply_processors, make_logits_processors
from engine.generation.sampling import Sampler, SamplerContext, make_sampler
from engine.text.fim_trim import CompletionRules, first_unmatched_closer
from engine.text.tokenizer import Tokenizer

_BREAKS = ("\n", "\r")


@dataclass
class _Vocab:
    """Per-tokenizer facts about each token's text, computed once."""

    texts: list[str]
    #: Ids whose text has a visible character (special tokens never: they are not output).
    visible: np.ndarray
    special: np.ndarray
    #: Ids by the first character after leading spaces/tabs (only the few we mask by).
    by_first: dict[str, np.ndarray]
    _spelling: dict[tuple[str, bool], np.ndarray] = field(default_factory=dict)

    def spelling(self, rest: str, no_break_after: bool) -> np.ndarray:
        """Ids that go on spelling ``rest`` (a prefix of it, or it and then more: with
        ``no_break_after``, more that does not start with a line break)."""
        key = (rest, no_break_after)
        found = self._spelling.get(key)
        if found is None:
            ids = []
            for token, text in enumerate(self.texts):
                if not text or self.special[token]:
                    continue
                if rest.startswith(text):
                    ids.append(token)
                elif text.startswith(rest):
                    after = text[len(rest):].lstrip(" \t")
                    if not (no_break_after and after.startswith(_BREAKS)):
                        ids.append(token)
            found = np.array(ids, dtype=np.intp)
            if len(self._spelling) < 16:
                self._spelling[key] = found
        return found


_VOCABS: weakref.WeakKeyDictionary[Tokenizer, _Vocab] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _vocab(tokenizer: Tokenizer) -> _Vocab:
    with _LOCK:
        found = _VOCABS.get(tokenizer)
        if found is not None:
            return found
    texts = tokenizer.token_texts()
    special = np.zeros(len(texts), dtype=bool)
    special[[t for t in tokenizer.special_token_ids if t < len(texts)]] = True
    visible = np.array([bool(t.strip()) for t in texts], dtype=bool) & ~special
    firsts: dict[str, list[int]] = {c: [] for c in ("\n", ")", "]", "}")}
    for token, text in enumerate(texts):
        head = text.lstrip(" \t")[:1]
        if head == "\r":
            head = "\n"
        if head in firsts and not special[token]:
            firsts[head].append(token)
    vocab = _Vocab(texts, visible, special,
                   {c: np.array(ids, dtype=np.intp) for c, ids in firsts.items()})
    with _LOCK:
        _VOCABS[tokenizer] = vocab
    return vocab


class LineStartSampler:
    """A :data:`engine.sampling.CustomSampler` for prefix-only answers (module doc)."""

    name = "prefix-only"

    def __init__(self, tokenizer: Tokenizer, rules: CompletionRules, options: GenerateOptions,
                 *, eos_token_ids: Collection[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab = _vocab(tokenizer)
        self._rules = rules
        self._options = options
        self._masks = rules.masks_line_start
        closer = first_unmatched_closer(rules.line_prefix, rules.suffix)
        banned = [self._vocab.by_first["\n"], np.flatnonzero(self._vocab.special),
                  np.array([t for t in eos_token_ids if t < len(self._vocab.texts)],
                           dtype=np.intp)]
        if closer is not None:
            banned.append(self._vocab.by_first[closer])
        self._banned = np.unique(np.concatenate(banned)) if self._masks else None
        self._inner: Sampler = make_sampler(options)
        self._truncation = [] if options.is_greedy else make_logits_processors(
            GenerateOptions(top_k=options.top_k, top_p=options.top_p, min_p=options.min_p))
        self._done = False

    def __call__(self, logits: np.ndarray, context: SamplerContext) -> int:
        if context.step == 0:  # a new run of this request: its own seeded stream
            self._inner = make_sampler(self._options)
            self._done = False
        if not self._done:
            generated = np.asarray(context.generated_ids, dtype=np.intp)
            generated = generated[generated < len(self._vocab.texts)]
            if generated.size and self._vocab.visible[generated].any():
                self._done = True
            else:
                logits = self._mask(logits, context.generated_ids)
        state = ProcessorContext(prompt_ids=(), generated_ids=list(context.generated_ids))
        if self._truncation:
            logits = apply_processors(logits, self._truncation, state)
        return self._inner(logits, state)

    def _mask(self, logits: np.ndarray, generated: tuple[int, ...]) -> np.ndarray:
        heal = self._rules.heal
        spelled = self._tokenizer.decode(generated, skip_special=True) if generated else ""
        if heal and heal.startswith(spelled) and len(spelled) < len(heal):
            allowed = self._vocab.spelling(heal[len(spelled):], self._masks)
            return _keep_only(logits, allowed)
        if self._banned is None:
            return logits
        return _drop(logits, self._banned)


def _drop(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ids = ids[ids < logits.shape[0]]
    masked = np.array(logits, dtype=np.float32)
    masked[ids] = -np.inf
    return masked if math.isfinite(float(masked.max())) else logits


def _keep_only(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ids = ids[ids < logits.shape[0]]
    if not ids.size or not np.isfinite(logits[ids]).any():
        return logits  # nothing spells it: better an answer than an error
    masked = np.full(logits.shape, -np.inf, dtype=np.float32)
    masked[ids] = logits[ids]
    return masked


def chain_options(options: GenerateOptions) -> GenerateOptions:
    """``options`` for the engine's own processor chain under a :class:`LineStartSampler`:
    no truncation (the sampler truncates after its mask)."""
    return replace(options, top_k=0, top_p=1.0, min_p=0.0)
