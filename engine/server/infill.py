"""llama.cpp's /infill prompt: the model's FIM layout, the typed part of the current line
after the middle token, repo-level extra files, and truncation to fit the context.

A model without FIM tokens gets the prefix-only layout (``engine.generation.fim_plain``): the typed
part simply ends the prefix, which the layout itself clips to its token budget.

When the prompt does not leave room for the answer, extra files go first (oldest first),
then the prefix loses its start and the suffix its end (the prefix keeps at least three
quarters of what remains, as in llama.cpp). What was dropped is reported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from engine.config import GenerateOptions
from engine.engine import Engine, GenerateRequest
from engine.generation.fim_plain import FimLines, reserve_for
from engine.server.errors import ApiError
from engine.text.fim import FimFile


@dataclass(frozen=True)
class InfillPrompt:
    request: GenerateRequest
    #: Prompt tokens the full layout would have had beyond what was sent.
    dropped_tokens: int

    @property
    def truncated(self) -> bool:
        return self.dropped_tokens > 0


def _build(engine: Engine, prefix: str, suffix: str, typed: str, files: Sequence[FimFile],
           options: GenerateOptions, lines: FimLines) -> GenerateRequest:
    if engine.fim_family is None:
        return engine.fim_request(prefix + typed, suffix, options, extra_files=files,
                                  lines=lines)
    request = engine.fim_request(prefix, suffix, options, extra_files=files)
    assert request.token_ids is not None
    if not typed:
        return request
    typed_ids = engine.tokenizer.encode(typed, parse_special=False)
    return replace(request, token_ids=(*request.token_ids, *typed_ids))


def _clean(text: str) -> str:
    return text.strip("\ufffd")


def build_infill(engine: Engine, prefix: str, suffix: str, typed: str,
                 files: Sequence[FimFile], options: GenerateOptions,
                 lines: FimLines = "auto") -> InfillPrompt:
    """The infill request, truncated to leave room for the answer (see module docstring).
    ``lines``: single or multi-line answers of the prefix-only layout."""
    total = engine.max_total(options)
    reserve = reserve_for(options, total)
    budget = total - reserve
    request = _build(engine, prefix, suffix, typed, files, options, lines)
    full = size = len(request.token_ids or ())
    kept = list(files)
    while kept and size > budget:
        kept.pop(0)
        request = _build(engine, prefix, suffix, typed, kept, options, lines)
        size = len(request.token_ids or ())
    tokenizer = engine.tokenizer
    target = budget
    for _ in range(4):
        if size <= budget:
            break
        p_ids = tokenizer.encode(prefix, parse_special=False) if prefix else []
        s_ids = tokenizer.encode(suffix, parse_special=False) if suffix else []
        room = target - (size - len(p_ids) - len(s_ids))
        if room < 1:
            raise ApiError(400, f"the infill prompt needs {size} tokens without any code "
                           f"context; the context holds {total} with {reserve} kept for the "
                           "answer", code="context_length_exceeded", param="prompt",
                           hint="send a shorter prompt (the typed part of the line)")
        keep_p = min(len(p_ids), max(room - len(s_ids), (room * 3) // 4))
        keep_s = max(0, min(len(s_ids), room - keep_p))
        prefix = _clean(tokenizer.decode(p_ids[len(p_ids) - keep_p:])) if keep_p else ""
        suffix = _clean(tokenizer.decode(s_ids[:keep_s])) if keep_s else ""
        request = _build(engine, prefix, suffix, typed, kept, options, lines)
        size = len(request.token_ids or ())
        target -= max(1, size - budget)  # retokenizing may have grown it: aim lower
    if size > budget:
        raise ApiError(400, f"the infill prompt has {size} tokens and cannot be cut to fit "
                       f"{budget}", code="context_length_exceeded", param="prompt")
    return InfillPrompt(request, max(0, full - size))


def warm_job(engine_of: Callable[[], Engine], prefix: str, suffix: str, typed: str,
             files: Sequence[FimFile], lines: FimLines = "auto"
             ) -> Callable[[threading.Event], Iterator[int]]:
    """A background job for llama.vim's ``n_predict: 0``: run the infill prompt (one
    token) so its KV lands in the prefix cache and the next completion that shares the
    start (the extra files come first) prefills only the rest. Yields the prompt length."""

    def job(cancel: threading.Event) -> Iterator[int]:
        engine = engine_of()
        options = GenerateOptions(max_new_tokens=1, temperature=0.0)
        fitted = build_infill(engine, prefix, suffix, typed, files, options, lines)
        engine.generate(fitted.request, cancel)
        yield len(fitted.request.token_ids or ())

    return job
