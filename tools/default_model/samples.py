"""Training rows: plain left-to-right code, fill-in-the-middle (PSM and SPM, Qwen tokens,
the engine's layouts) and chat-formatted function requests, packed into fixed-length rows.

Pieces (prefix, suffix, middle) are tokenized separately, as the engine's FIM path does.
Each token has a loss weight: the middle of a FIM sample (and its end token) weighs
``Mix.middle_weight``, so the few tokens that teach "continue the prefix, meet the suffix"
are not drowned by the context around them. Every choice comes from one seeded ``numpy``
generator: same seed, same rows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from tools.default_model.corpus import ChatExample, EditExample, SourceFile
from tools.default_model.tokenizer import (
    ENDOFTEXT,
    FILE_SEP,
    FIM_MIDDLE,
    FIM_PREFIX,
    FIM_SUFFIX,
    IM_END,
    IM_START,
)

CHARS_PER_TOKEN = 3.6
#: How a rename edit forms the new name from the old one.
RENAMES = ("{}_value", "new_{}", "{}2", "{}_arg", "the_{}", "{}_")
Sample = tuple[list[int], list[float]]  # ids and their loss weights


@dataclass(frozen=True)
class Mix:
    fim: float = 0.7  # share of samples that are FIM
    chat: float = 0.08  # share that are chat
    edit: float = 0.0  # share that are rename edits (function, request, rewrite); the rest
    #: is plain text
    spm: float = 0.25  # share of FIM samples in suffix-prefix-middle order
    line_holes: float = 0.6  # share of FIM samples whose middle is whole lines
    single_line: float = 0.75  # share of those line holes that are one line (else 2 to 5)
    file_header: float = 0.15  # share of FIM samples under a <|file_sep|>path header
    middle_weight: float = 3.0  # loss weight of FIM middle tokens (others: 1)
    nonblank_holes: bool = True  # line holes start at a non-blank line; spans not empty


def _token_id(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer lacks {token}")
    return int(token_id)


class SampleBuilder:
    def __init__(self, tok: Tokenizer, files: tuple[SourceFile, ...],
                 chat: list[ChatExample], seq_len: int, seed: int, mix: Mix = Mix(),
                 edits: list[EditExample] | None = None) -> None:
        self.tok, self.files, self.chat, self.seq_len, self.mix = tok, files, chat, seq_len, mix
        self.edits = edits or []
        self.rng = np.random.default_rng(seed)
        sizes = np.array([len(f.text) for f in files], np.float64)
        self.weights = sizes / sizes.sum()
        self.special = {t: _token_id(tok, t) for t in
                        (ENDOFTEXT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, IM_END,
                         IM_START)}

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids) if text else []

    def _window(self, max_tokens: int) -> tuple[SourceFile, str, bool]:
        """A random line-aligned window of about ``max_tokens`` tokens of a random file;
        also whether it reaches the end of the file."""
        item = self.files[int(self.rng.choice(len(self.files), p=self.weights))]
        text = item.text
        width = int(max_tokens * CHARS_PER_TOKEN)
        start = int(self.rng.integers(0, max(1, len(text) - width // 2)))
        start = 0 if start == 0 else text.find("\n", start) + 1
        end = min(len(text), start + width)
        cut = text.rfind("\n", start, end)
        if end < len(text) and cut > start:
            end = cut + 1
        return item, text[start:end], end >= len(text)

    def plain(self) -> Sample:
        size = int(math.exp(self.rng.uniform(math.log(32), math.log(self.seq_len))))
        _, text, at_end = self._window(size)
        ids = self.encode(text)
        ids = ids + [self.special[ENDOFTEXT]] if at_end else ids
        return ids, [1.0] * len(ids)

    def _split(self, text: str) -> tuple[str, str, str]:
        """(prefix, middle, suffix): whole lines or a random character span. With
        ``Mix.nonblank_holes`` a line hole starts at a non-blank line and a span is never
        empty (editors ask for code, not for nothing)."""
        nonblank = self.mix.nonblank_holes
        if self.rng.random() < self.mix.line_holes:
            starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]
            firsts = [k for k, i in enumerate(starts) if text[i] != "\n"] if nonblank \
                else list(range(len(starts)))
            first = firsts[int(self.rng.integers(0, len(firsts)))] if firsts else 0
            count = 1 if self.rng.random() < self.mix.single_line else int(self.rng.integers(2, 6))
            last = min(len(starts), first + count)
            a, b = starts[first], starts[last] if last < len(starts) else len(text)
        else:
            span = int(self.rng.integers(int(nonblank), max(2, len(text) // 3)))
            a = int(self.rng.integers(0, max(1, len(text) - span)))
            b = a + span
        return text[:a], text[a:b], text[b:]

    def fim(self) -> Sample:
        """A FIM sample of a window of log-uniform random size, 24 tokens to 90% of a row:
        short ones put several middles in a row, each a lesson in where the middle starts."""
        low, high = math.log(24), math.log(self.seq_len * 0.9)
        size = int(math.exp(self.rng.uniform(low, high)))
        item, text, _ = self._window(size)
        prefix, middle, suffix = self._split(text)
        sp = self.special
        p, m, s = self.encode(prefix), self.encode(middle), self.encode(suffix)
        m = m[: self.seq_len // 2]
        room = self.seq_len - len(m) - 8
        while len(p) + len(s) > room:  # trim the far ends: prefix from the left
            if len(p) >= len(s):
                p = p[len(p) + len(s) - room:] if len(s) < room else p[len(p) // 2:]
            else:
                s = s[: max(0, room - len(p))]
        head = [sp[FILE_SEP], *self.encode(f"{item.path}\n")] \
            if self.rng.random() < self.mix.file_header else []
        if self.rng.random() < self.mix.spm:
            context = [*head, sp[FIM_PREFIX], sp[FIM_SUFFIX], *s, sp[FIM_MIDDLE], *p]
        else:
            context = [*head, sp[FIM_PREFIX], *p, sp[FIM_SUFFIX], *s, sp[FIM_MIDDLE]]
        middle_ids = [*m, sp[ENDOFTEXT]]
        # weight i belongs to the prediction of ids[i] (from ids[:i])
        return ([*context, *middle_ids],
                [1.0] * len(context) + [self.mix.middle_weight] * len(middle_ids))

    def chat_sample(self) -> Sample:
        ex = self.chat[int(self.rng.integers(0, len(self.chat)))]
        sp = self.special
        nl = self.encode("\n")
        ids = [sp[IM_START], *self.encode(f"user\n{ex.user}"), sp[IM_END], *nl,
               sp[IM_START], *self.encode(f"assistant\n{ex.assistant}"), sp[IM_END], *nl,
               sp[ENDOFTEXT]]
        return ids, [1.0] * len(ids)

    def edit_sample(self) -> Sample:
        """A function, a comment asking for one of its names renamed, and the rewrite (every
        whole-word occurrence replaced): teaches the model to reproduce code it was shown,
        which an editor's rewrite requests and prompt-lookup speculation rely on. The
        rewrite weighs ``Mix.middle_weight``."""
        ex = self.edits[int(self.rng.integers(0, len(self.edits)))]
        old = ex.names[0] if self.rng.random() < 0.6 else \
            ex.names[int(self.rng.integers(0, len(ex.names)))]
        style = int(self.rng.integers(0, len(RENAMES)))
        new = RENAMES[style].format(old)
        edited = re.sub(rf"\b{re.escape(old)}\b", new, ex.source)
        request = self.encode(f"{ex.source}\n\n# The same function, with `{old}` renamed to "
                              f"`{new}`:\n")
        answer = [*self.encode(edited + "\n"), self.special[ENDOFTEXT]]
        return ([*request, *answer],
                [1.0] * len(request) + [self.mix.middle_weight] * len(answer))

    def sample(self) -> Sample:
        r = self.rng.random()
        if r < self.mix.fim:
            return self.fim()
        if r < self.mix.fim + self.mix.chat and self.chat:
            return self.chat_sample()
        if r < self.mix.fim + self.mix.chat + self.mix.edit and self.edits:
            return self.edit_sample()
        return self.plain()

    def row(self) -> Sample:
        """``seq_len + 1`` ids and weights: samples packed back to back (the last one cut)."""
        ids: list[int] = []
        weights: list[float] = []
        while len(ids) < self.seq_len + 1:
            more, more_weights = self.sample()
            ids += more
            weights += more_weights
        return ids[: self.seq_len + 1], weights[: self.seq_len + 1]

    def batch(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """ids ``[size, seq_len + 1]`` (int64) and their loss weights (float32)."""
        rows = [self.row() for _ in range(size)]
        return (np.array([r[0] for r in rows], np.int64),
                np.array([r[1] for r in rows], np.float32))
