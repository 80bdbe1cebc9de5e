"""One generation as the server runs it, on the engine thread.

Wraps ``Engine.stream`` with what the dialects add on top of the engine's own stop rules:
llama.cpp's prediction budget (``t_max_predict_ms``: once it has run out, the answer
stops at the next token that holds a line break, as llama.cpp does, so a line is never
cut midway), minimum indentation (``n_indent``) and, for a prefix-only infill (a model
without FIM tokens), the completion rules of ``engine.text.fim_trim`` (text they may still
trim is held back). llama.cpp does not enforce ``t_max_prompt_ms``, and neither does this:
a slow cold prefill still gives a suggestion. Each yields :class:`Chunk` items (one per
engine event) and a last :class:`Final`. A limit or a completion rule stops the engine
through the job's cancel flag, so it acts within one token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Literal

from engine.engine import Engine, GenerateRequest, GenerateResult, Timings
from engine.generation.fim_plain import trim_events, trimmer_for
from engine.generation.sampling import TokenLogprob
from engine.generation.stopping import CANCELLED
from engine.scheduling.scheduler import Priority, Scheduler

LimitKind = Literal["t_max_predict_ms", "n_indent"]
#: Budgets longer than a day are no budget (and would overflow a timer).
_MAX_BUDGET_MS = 86_400_000.0
StopKind = Literal["eos", "stop", "max_tokens", "length", "limit", "cancelled"]


@dataclass(frozen=True)
class Limits:
    """Budgets beyond the engine's options; ``None``/0 = no limit."""

    #: Measured from the first generated token; acts at the next line break after it.
    predict_ms: float | None = None
    #: Stop at a line (after the first) indented by fewer than this many spaces/tabs.
    n_indent: int = 0


@dataclass(frozen=True)
class Chunk:
    """Text that became final with one engine event (may be empty), and its token."""

    text: str
    token_id: int | None
    logprob: TokenLogprob | None
    timestamp: float
    #: A reasoning model's thought text that became final with this event.
    thought: str = ""

    @property
    def is_step(self) -> bool:
        return self.token_id is not None


@dataclass(frozen=True)
class Final:
    result: GenerateResult
    #: All text emitted (the chunks' text joined), after any ``n_indent`` cut.
    text: str
    limit: LimitKind | None = None
    is_step: bool = False
    #: The completion rule that ended a prefix-only infill (``engine.text.fim_trim``); its
    #: result finishes as ``eos_token``.
    rule: str | None = None

    @property
    def stop(self) -> StopKind:
        if self.limit is not None:
            return "limit"
        kind = self.result.finish_reason.kind
        # a closed JSON value is a natural end, as EOS is
        return {"eos_token": "eos", "json_complete": "eos", "stop_sequence": "stop",
                "max_tokens": "max_tokens", "length": "length",
                "cancelled": "cancelled"}[kind]  # type: ignore[return-value]

    @property
    def completion_tokens(self) -> int:
        return len(self.result.token_ids)


class IndentGate:
    """llama.cpp's ``n_indent``: a line after the first that starts with fewer than
    ``n_indent`` spaces/tabs ends the text just before its first visible character.
    A line's leading whitespace is held until that character shows whether it stays."""

    def __init__(self, n_indent: int) -> None:
        self._n = n_indent
        self._pending: str | None = None  # leading whitespace of the current line
        self.stopped = False

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            if self.stopped:
                break
            if self._pending is None:
                out.append(ch)
                if ch == "\n":
                    self._pending = ""
            elif ch in " \t":
                self._pending += ch
            elif ch == "\n":
                out.append(self._pending + ch)
                self._pending = ""
            else:
                out.append(self._pending)
                self._pending = None
                if len(out[-1]) < self._n:
                    self.stopped = True
                    break
                out.append(ch)
        return "".join(out)

    def flush(self) -> str:
        held, self._pending = self._pending or "", None
        return "" if self.stopped else held


def _empty_result(engine: Engine, request: GenerateRequest, started: float) -> GenerateResult:
    """The result of a request cancelled before its first prefill chunk ran."""
    try:
        prompt = len(engine.encode_request(request))
    except Exception:
        prompt = 0
    total = (time.perf_counter() - started) * 1e3
    return GenerateResult(text="", token_ids=(), finish_reason=CANCELLED, prompt_tokens=prompt,
                          timings=Timings(ttft_ms=0.0, prefill_tok_s=0.0, decode_tok_s=0.0,
                                          total_ms=total))


def run_generation(engine: Engine, request: GenerateRequest, cancel: threading.Event,
                   limits: Limits = Limits(),
                   priority: Priority = "normal",
                   session_id: int | None = None) -> Iterator[Chunk | Final]:
    """Stream ``request`` on ``engine`` through its scheduler (call on the engine thread:
    several of these consumed in turn run, and batch, together). With ``session_id`` the
    request holds only the new tokens of that engine session's turn."""
    started = time.perf_counter()
    gate = IndentGate(limits.n_indent) if limits.n_indent > 0 else None
    trimmer = trimmer_for(request)
    pieces: list[str] = []
    first_at: float | None = None
    limit: LimitKind | None = None
    result: GenerateResult | None = None
    stream = Scheduler.of(engine).stream(request, priority=priority, cancel=cancel,
                                         session_id=session_id)
    if trimmer is not None:  # the job's flag: a finished answer stops the engine
        stream = trim_events(stream, trimmer, cancel)
    with closing(stream) as events:
        for event in events:
            if event.result is not None:
                result = event.result
                break
            if event.token_id is not None and first_at is None:
                first_at = event.timestamp
            text = "" if limit == "t_max_predict_ms" else event.text  # the line is done
            if gate is not None:
                text = gate.feed(text)
                if gate.stopped and limit is None:
                    limit = "n_indent"
                    cancel.set()
            pieces.append(text)
            yield Chunk(text, event.token_id, event.logprob, event.timestamp, event.thought)
            if (limits.predict_ms and limits.predict_ms < _MAX_BUDGET_MS
                    and first_at is not None and limit is None and "\n" in event.text
                    and event.timestamp - first_at > limits.predict_ms / 1e3):
                limit = "t_max_predict_ms"
                cancel.set()
    if gate is not None:
        tail = gate.flush()
        if tail:
            pieces.append(tail)
            yield Chunk(tail, None, None, time.perf_counter())
    if result is None:
        result = _empty_result(engine, request, started)
    rule = trimmer.rule if trimmer is not None and limit is None else None
    yield Final(result, "".join(pieces), limit, rule=rule)


def generation_job(engine_of: Callable[[], Engine], request: GenerateRequest,
                   limits: Limits = Limits(),
                   on_final: Callable[[Final], None] | None = None,
                   priority: Priority = "normal",
                   ) -> Callable[[threading.Event], Iterator[Chunk | Final]]:
    """A worker job: resolve the engine when the job starts (it may have been unloaded
    while the job waited: ``engine_of`` raises then), run, report the final item."""

    def job(cancel: threading.Event) -> Iterator[Chunk | Final]:
        engine = engine_of()
        for item in run_generation(engine, request, cancel, limits, priority):
            if isinstance(item, Final) and on_final is not None:
                on_final(item)
            yield item

    return job
