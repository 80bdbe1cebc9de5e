"""When generation stops: EOS, token stop sequences, text stop strings with hold-back, limits.

Contract with the engine, per generated token:

1. ``check_token(token, generated_ids)`` with ``generated_ids`` already ending in ``token``.
   When it returns a reason (EOS or a token stop sequence), the engine stops and does NOT
   feed that token's text, so EOS / stop-token text never reaches the user. Text of the
   earlier tokens of a multi-token stop sequence may already have been emitted; an engine
   that wants to hide it can hold back ``token_stop_prefix_len(generated_ids)`` tokens.
2. Otherwise ``feed_text(new_text)`` with the token's detokenized text; emit what it
   returns. A text stop string may span several feeds; text that could still become one
   is held back (at most ``max(len(stop)) - 1`` characters) and the stop text itself is
   never returned.
3. At the end without a stop (max_tokens, length, cancel), emit ``flush()``.

Under a constraint the engine calls ``check_constrained`` instead (no text is held
back): nothing stops the generation while the answer is incomplete, and a text stop never
cuts it. ``json_complete`` ends a generation whose grammar closed (see
``engine.generation.guidance``).

Text a request healed (``GenerateRequest.healed``: taken off the prompt's end, spelled
again by the first generated tokens) belongs to the prompt: stop strings are matched only
in the text after it, so they apply to the answer alone.

EOS and token stop sequences are ignored while no more than ``min_new_tokens`` tokens
were generated (the processor chain also masks EOS / single-token stops until then);
text stop strings are not affected by ``min_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from engine.api import FinishKind as FinishKind
from engine.api import FinishReason as FinishReason
from engine.config import GenerateOptions

__all__ = [
    "CANCELLED",
    "EOS_TOKEN",
    "JSON_COMPLETE",
    "LENGTH",
    "MAX_TOKENS",
    "FinishKind",
    "FinishReason",
    "StopChecker",
    "stop_prefix_len",
]

MAX_TOKENS = FinishReason("max_tokens")
EOS_TOKEN = FinishReason("eos_token")
LENGTH = FinishReason("length")
CANCELLED = FinishReason("cancelled")
#: A JSON-constrained value closed (its last token is part of the output).
JSON_COMPLETE = FinishReason("json_complete")


def stop_prefix_len(text: str, prefixes: Collection[str], longest: int) -> int:
    """Length of the longest suffix of ``text`` (at most ``longest`` chars) in ``prefixes``."""
    for size in range(min(len(text), longest), 0, -1):
        if text[-size:] in prefixes:
            return size
    return 0


class StopChecker:
    """Stop conditions of one request; feed it every generated token (see module doc).

    ``eos_token_ids`` are the model's EOS ids; ``options.eos_token_ids`` overrides them
    when set. All of them count.
    """

    def __init__(self, options: GenerateOptions, *, eos_token_ids: Collection[int],
                 healed: str = "") -> None:
        self._options = options
        #: The rest of the healed text the generated text has not spelled yet.
        self._healing = healed
        #: Characters of the generated text that spelled healed text (no stop starts there).
        self._healed_chars = 0
        eos = options.eos_token_ids if options.eos_token_ids is not None else eos_token_ids
        self._eos = frozenset(eos) if options.stop_on_eos else frozenset()
        self._min_new = options.min_new_tokens
        # Token stop sequences grouped by their last token: one dict lookup per token.
        self._by_last: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        self._text: list[tuple[int, str]] = []
        for index, stop in enumerate(options.stop_sequences):
            if isinstance(stop, str):
                self._text.append((index, stop))
            else:
                self._by_last.setdefault(stop[-1], []).append((index, stop))
        self._token_stops = [seq for group in self._by_last.values() for _, seq in group]
        self._longest = max((len(s) for _, s in self._text), default=0)
        self._prefixes = frozenset(s[:n] for _, s in self._text for n in range(1, len(s)))
        self._held = ""
        self._finished: FinishReason | None = None

    @property
    def single_token_stop_ids(self) -> frozenset[int]:
        """Ids that stop generation on their own: EOS ids and one-token stop sequences,
        for the ``min_new_tokens`` mask (``make_logits_processors(stop_token_ids=...)``)."""
        singles = {seq[0] for seq in self._token_stops if len(seq) == 1}
        return self._eos | singles

    @property
    def held_text(self) -> str:
        """Text held back because it may be the start of a stop string."""
        return self._held

    def check_token(self, token_id: int, generated_ids: Sequence[int]) -> FinishReason | None:
        """EOS first, then token stop sequences (suffix match; lowest index wins)."""
        assert generated_ids and generated_ids[-1] == token_id, "append the token first"
        if len(generated_ids) <= self._min_new:
            return None
        if token_id in self._eos:
            return EOS_TOKEN
        for index, seq in self._by_last.get(token_id, ()):
            if len(seq) <= len(generated_ids) and tuple(generated_ids[-len(seq) :]) == seq:
                return FinishReason("stop_sequence", index)
        return None

    def token_stop_prefix_len(self, generated_ids: Sequence[int]) -> int:
        """Longest tail of ``generated_ids`` that is a proper prefix of a token stop sequence."""
        best = 0
        for seq in self._token_stops:
            for size in range(min(len(seq) - 1, len(generated_ids)), best, -1):
                if seq[:size] == tuple(generated_ids[-size:]):
                    best = size
                    break
        return best

    def feed_text(self, new_text: str) -> tuple[str, FinishReason | None]:
        """Text safe to emit now, and the stop reason once a stop string completed.

        Among stop strings, the one completing first in the text wins (then the one
        starting first, then the lower index); this does not depend on how the text was
        split into feeds. After a stop, further feeds return ``("", reason)``.
        """
        if self._finished is not None:
            return "", self._finished
        if not self._text:
            return new_text, None
        healed, new_text = self._take_healed(new_text)
        if not new_text:
            return healed, None
        text, finish = self._feed_answer(new_text)
        return healed + text, finish

    def _take_healed(self, new_text: str) -> tuple[str, str]:
        """``new_text`` split into the part that spells healed text and the rest. Healing
        ends at the first character that differs from it, or once it is spelled."""
        if not self._healing:
            return "", new_text
        size = 0
        limit = min(len(new_text), len(self._healing))
        while size < limit and new_text[size] == self._healing[size]:
            size += 1
        self._healing = self._healing[size:] if size == len(new_text) else ""
        self._healed_chars += size
        return new_text[:size], new_text[size:]

    def _feed_answer(self, new_text: str) -> tuple[str, FinishReason | None]:
        held = len(self._held)
        text = self._held + new_text
        found: tuple[int, int, int] | None = None  # (end, start, index)
        for index, stop in self._text:
            # Held text holds no complete stop: a match must end inside new_text.
            start = text.find(stop, max(0, held - len(stop) + 1))
            if start >= 0:
                candidate = (start + len(stop), start, index)
                if found is None or candidate < found:
                    found = candidate
        if found is not None:
            self._held = ""
            self._finished = FinishReason("stop_sequence", found[2])
            return text[: found[1]], self._finished
        keep = stop_prefix_len(text, self._prefixes, self._longest - 1)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def check_constrained(self, token_id: int, generated_ids: Sequence[int], text: str,
                          new_chars: int, *, complete: bool) -> FinishReason | None:
        """The stop rules under a JSON constraint: stop sequences are deferred until the
        value is complete. Then EOS first, token stop sequences, and a text stop whose
        match ends in the last ``new_chars`` characters of ``text`` (everything generated
        so far). Nothing is held back or cut: a constrained value stays whole."""
        self._take_healed(text[len(text) - new_chars:])
        if not complete:
            return None
        reason = self.check_token(token_id, generated_ids)
        if reason is not None:
            return reason
        found: tuple[int, int, int] | None = None  # (end, start, index)
        for index, stop in self._text:
            start = text.find(stop, max(self._healed_chars,
                                        len(text) - new_chars - len(stop) + 1))
            if start >= 0:
                candidate = (start + len(stop), start, index)
                if found is None or candidate < found:
                    found = candidate
        return None if found is None else FinishReason("stop_sequence", found[2])

    def flush(self) -> str:
        """The held-back text, at the end of a generation that did not hit a stop string."""
        held, self._held = self._held, ""
        return held

    def check_limits(self, generated: int, total: int, max_context: int) -> FinishReason | None:
        """``max_tokens`` once ``max_new_tokens`` were generated, else ``length`` once the
        sequence (prompt + generated) fills ``max_context``."""
        if generated >= self._options.max_new_tokens:
            return MAX_TOKENS
        if total >= max_context:
            return LENGTH
        return None
