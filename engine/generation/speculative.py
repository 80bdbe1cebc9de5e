"""Speculative decoding that keeps greedy output unchanged: propose, verify, rewind.

A proposer guesses the next K tokens; the target model runs the pending token and the K
guesses in one forward pass; the longest prefix of guesses that equals the target's own
greedy choices is kept, plus the target's next token, and the KV of the rejected guesses
is rewound. Code editing repeats what is on the screen, so prompt lookup (the tokens that
followed the last occurrence of the current n-gram in the prompt or the output) often
yields several tokens per forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from engine.api import SpeculativeStats as SpeculativeStats
from engine.errors import InvalidOptionError


class Proposer(Protocol):
    def propose(self, history: Sequence[int], k: int) -> list[int]: ...


class PromptLookup:
    """Proposes the continuation of the latest earlier occurrence of the trailing n-gram.

    An index of every n-gram (n <= ngram) to where its latest occurrence continues is kept
    up to date as the history grows, so a proposal costs O(ngram), not a scan of the
    history: what matters when nothing matches and each step pays for the lookup anyway.
    A continuation that reaches the end of the history goes on copying what it has just
    proposed (an overlapping copy, as in LZ77): in a loop of period p the latest
    occurrence is p tokens back, and the guess would otherwise stop after p tokens.

    While the output copies a stretch of the history token by token, the proposal follows
    that stretch (a copy pointer) instead of the latest occurrence of the tail: in a
    rewrite with a renamed variable the n-gram around each new name occurs in the output
    itself, where it is followed by the wrong code. When the output leaves the stretch (a
    name grows a suffix, a line is added), the pointer stays where the output left and the
    copy resumes when the output comes back to it, or is dropped after ``patience`` tokens
    that do not; meanwhile the n-gram lookup proposes. What the output inserted before
    coming back is remembered by the token it followed: the next time the copy reaches that
    token (the same name, renamed again), the guess is the insertion, then the copy.
    """

    def __init__(self, ngram: int = 3, max_tokens: int = 8, patience: int = 4) -> None:
        for name, value in (("ngram", ngram), ("max_tokens", max_tokens),
                            ("patience", patience)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidOptionError(f"prompt_lookup.{name}", f"expected an integer > 0, "
                                         f"got {value!r}", hint="e.g. ngram=3, max_tokens=8")
        self.ngram = ngram
        self.max_tokens = max_tokens
        self.patience = patience
        self._seen: list[int] = []
        #: Per n: n-gram -> index just after its latest occurrence that has a continuation.
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(ngram)]
        #: The copy pointer: where in the history the output's next token is expected,
        #: and how many tokens in a row the output has not matched it (None: no copy).
        self._copy: int | None = None
        self._missed = 0
        #: What the output inserted after a copied token before the copy went on (a renamed
        #: name's new suffix): last copied token -> the inserted tokens.
        self._inserts: dict[int, tuple[int, ...]] = {}

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to `k` guessed tokens after `history` (empty when nothing matches)."""
        k = min(k, self.max_tokens)
        if k <= 0:
            return []
        seq = self._sync(history)
        copy, missed = self._copy, self._missed
        if copy is not None:
            # the copy, after what the output inserted at this point the last time
            inserted = self._inserts.get(seq[copy - 1], ()) if copy > 0 else ()
            if missed == 0:  # in step: the insertion first, unless the copied text has it
                head = inserted if inserted and seq[copy] != inserted[0] else ()
                return self._continue(seq, copy, k, head)
            if inserted[:missed] == tuple(seq[-missed:]):  # in the middle of the insertion
                return self._continue(seq, copy, k, inserted[missed:])
        start, n = self._latest(seq)
        if start is None:
            if copy is None:
                return []
            start = copy  # nothing matches: guess the copy resumes here
        elif copy is None and n >= 2:
            self._copy, self._missed = start, 0
        return self._continue(seq, start, k)

    def _continue(self, seq: list[int], start: int, k: int,
                  head: Sequence[int] = ()) -> list[int]:
        """``head``, then the copy of ``seq`` from ``start`` on, ``k`` tokens in all, with
        each remembered insertion spliced in after the token it follows (unless the copied
        text has it already). Past the end of the history the copy goes on over what it
        proposed itself (an overlapping copy)."""
        out = list(head[:k])
        n = len(seq)

        def at(pos: int) -> int:  # the history, then this proposal
            return seq[pos] if pos < n else out[pos - n]

        pos = start
        while len(out) < k:
            token = at(pos)
            pos += 1
            out.append(token)
            inserted = self._inserts.get(token)
            if inserted and at(pos) != inserted[0]:
                out.extend(inserted[:k - len(out)])
        return out

    def _latest(self, seq: list[int]) -> tuple[int | None, int]:
        """Where the latest earlier occurrence of the longest tail n-gram continues, and n."""
        for n in range(min(self.ngram, len(seq) - 1), 0, -1):
            start = self._index[n - 1].get(tuple(seq[-n:]))
            if start is not None:
                return start, n
        return None, 0

    def _follow(self, seq: list[int], begin: int) -> None:
        """Move the copy pointer over the tokens ``seq[begin:]`` the history gained."""
        for i in range(begin, len(seq)):
            if self._copy is None:
                return
            if self._copy < i and seq[self._copy] == seq[i]:
                if self._copy > 0:  # what the output inserted before going on, if anything
                    after = seq[self._copy - 1]
                    if self._missed:
                        self._inserts[after] = tuple(seq[i - self._missed:i])
                    else:
                        self._inserts.pop(after, None)
                self._copy += 1
                self._missed = 0
            else:
                self._missed += 1
                if self._missed > self.patience:
                    self._copy = None

    def _sync(self, history: Sequence[int]) -> list[int]:
        """Index what `history` added since the last call (from scratch if it is not an
        extension of what was indexed) and move the copy pointer over it."""
        seen = self._seen
        done = len(seen)
        if len(history) < done or not _same_at(history, seen):
            seen.clear()
            for table in self._index:
                table.clear()
            done = 0
            self._copy, self._missed = None, 0
            self._inserts.clear()
        seen.extend(int(t) for t in history[done:])
        self._follow(seen, done)
        for end in range(max(done, 1), len(seen)):
            # the n-grams ending at `end`, continued by seen[end] (the tail is not indexed)
            for n in range(1, min(self.ngram, end) + 1):
                self._index[n - 1][tuple(seen[end - n:end])] = end
        return seen


def _same_at(history: Sequence[int], seen: list[int]) -> bool:
    """Whether ``history`` starts with ``seen``, checked at its ends and six points between
    (a whole compare per step grows with the context; a history that changed elsewhere only
    makes guesses worse, never output wrong: every guess is verified)."""
    done = len(seen)
    if done == 0:
        return True
    points = {0, done - 1, *(done * i // 7 for i in range(1, 7))}
    return all(history[i] == seen[i] for i in points)


class DraftModel:
    """Proposes with a smaller model of the same tokenizer, greedy, on its own runner.

    The draft runner keeps the KV of what it has seen; each proposal rewinds it to the
    part of the history it shares (rejected guesses) and feeds the rest.
    """

    def __init__(self, runner: DraftRunner, max_tokens: int = 8) -> None:
        self.runner = runner
        self.max_tokens = max_tokens

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        k = min(k, self.max_tokens, self.runner.context_length - len(history))
        if k <= 0:
            return []
        runner = self.runner
        shared = 0
        limit = min(len(runner.tokens), len(history) - 1)
        while shared < limit and runner.tokens[shared] == history[shared]:
            shared += 1
        runner.rewind(runner.length - shared)
        runner.reserve(len(history) + k)
        logits = runner.forward(np.asarray(history[shared:], dtype=np.int64))
        draft = [int(np.argmax(logits))]
        while len(draft) < k:
            logits = runner.forward(np.array(draft[-1:], dtype=np.int64))
            draft.append(int(np.argmax(logits)))
        return draft


class DraftRunner(Protocol):
    """What DraftModel needs of a decode runner (engine.decode.DecodeRunner)."""

    tokens: list[int]
    length: int
    context_length: int

    def rewind(self, n: int) -> None: ...

    def reserve(self, total_tokens: int) -> None: ...

    def forward(self, token_ids: np.ndarray, *, all_logits: bool = False) -> np.ndarray: ...





class AdaptiveK:
    """How many tokens to propose: shrinks while guesses fail, grows while they hold."""

    def __init__(self, start: int, maximum: int) -> None:
        self.k = max(1, min(start, maximum))
        self.maximum = maximum

    def update(self, proposed: int, accepted: int) -> None:
        if proposed and accepted == proposed:
            self.k = min(self.k + 1, self.maximum)
        elif proposed and accepted * 2 < proposed:
            self.k = max(1, self.k // 2)


def verify_greedy(rows: np.ndarray, draft: Sequence[int]) -> list[int]:
    """The tokens greedy decoding produces given logits `rows` for [pending, *draft]:
    the draft's longest prefix matching the argmax, then the target's own next token."""
    greedy = np.argmax(rows, axis=1)
    accepted = 0
    while accepted < len(draft) and int(greedy[accepted]) == draft[accepted]:
        accepted += 1
    return [*draft[:accepted], int(greedy[accepted])]
