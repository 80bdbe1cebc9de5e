"""The Engine facade: load a model folder, turn requests into streams of events.

KV reuse is the default. The runner keeps the KV of the last sequence it ran (the
"slot"); a new request rewinds it to the longest common prefix, or imports longer
prefixes from the prefix cache or its session's pages, and prefills only the rest.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.api import GenerateEvent, GenerateRequest, GenerateResult, Timings
from engine.config import EngineConfig, GenerateOptions
from engine.errors import ContextOverflowError, InvalidPromptError
from engine.generation.fim_plain import FimLines, stop_flag, trim_events, trimmer_for
from engine.generation.mtp import MtpHead
from engine.generation.prompt import encode_request, fim_request, stop_ids
from engine.generation.request import RequestRun
from engine.generation.spec_heads import DeclaredHead
from engine.kernels import KernelUse
from engine.kv.cache import (
    KVGeometry,
    PagePool,
    PrefixCache,
)
from engine.kv.reuse import KVReuse
from engine.kv.sessions import Session, SessionStore
from engine.kv.shift import make_shifter
from engine.kv.tiers import KVTiers, model_identity
from engine.kv.window import windowed
from engine.loading import open_model
from engine.memory.governor import GovernorSnapshot, LimitOutcome, make_governor
from engine.model.io_spec import IOSpec
from engine.model.model_dir import ModelDir
from engine.runtime import cpu_share
from engine.runtime.cuda_graph import (
    NOT_REQUESTED,
    GraphCapture,
    describe_device,
    device_options,
)
from engine.runtime.decode import runner_factory
from engine.runtime.decode_gqa import SharedBufferRunner
from engine.runtime.draft import load_draft_runner
from engine.runtime.hugepages import BackgroundAdvice, HugePageReport
from engine.runtime.providers import SessionInfo
from engine.runtime.runner import DecodeRunner
from engine.scheduling.core import Preemptor
from engine.scheduling.pressure import (
    apply_limit,
    ensure_room,
    grow_reservation,
    page_admitter,
    reservation,
)
from engine.scheduling.scheduler import Scheduler
from engine.text.fim import (
    FimFamily,
    FimFile,
    FimOrder,
    detect_fim_family,
)
from engine.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

#: A stream of events; closing it early (a client went away) keeps the engine consistent.
EventStream = Generator[GenerateEvent, None, None]

__all__ = ["Engine", "GenerateEvent", "GenerateRequest", "GenerateResult", "Timings"]

class Engine:
    """One model, one ORT session, one KV runner. Not thread-safe: one engine thread."""

    def __init__(self, model: ModelDir, tokenizer: Tokenizer, session: Any,
                 session_info: SessionInfo, spec: IOSpec, config: EngineConfig, *,
                 graph_capture: GraphCapture = NOT_REQUESTED) -> None:
        self.model = model
        #: CUDA graph capture: asked for, on, and why not (engine.cuda_graph).
        self.graph_capture = graph_capture
        self.tokenizer = tokenizer
        self.session = session
        self.session_info = session_info
        self.spec = spec
        self.config = config
        limit = config.kv_max_len or model.context_length
        self.context_length = min(limit, model.context_length,
                                  spec.static_max_len or model.context_length)
        self.active_scheduler: Preemptor | None = None
        #: The draft model's runner (speculative_mode="draft_model"), when one is loaded.
        self.draft_runner: DecodeRunner | None = None
        #: A model-declared MTP / EAGLE-3 / shared-KV proposer that passed its contract
        #: checks, and the MTP head that runs it (speculative_mode="mtp") when it can run.
        self.declared_head: DeclaredHead | None = None
        self.mtp_head: MtpHead | None = None
        #: Why the model runs on the CPU although a GPU was there (None when it does not).
        self.placement_reason: str | None = None
        #: What its GroupQueryAttention nodes run (engine.kernels); None unless `load` made it.
        self.kernel_use: KernelUse | None = None
        self._huge_pages: BackgroundAdvice | None = None  # the collapse after a load, CPU
        self.cpu_share: cpu_share.CpuShare | None = None  # the kernels' threads, busy CPU
        self._new_runner = windowed(model, spec, self.context_length, config.context_shift,
                                    lambda rows: runner_factory(
            session, spec, rows, config.max_batch,
            device_options(config.device_kv, session_info.provider, spec.decode_path,
                           graph_capture),
            may_grow=lambda nbytes: self.governor.can_allocate(self.governor.kv_tier, nbytes)))
        #: One runner per concurrently running sequence; runner 0 serves `stream`.
        self.runners: list[DecodeRunner] = [self._new_runner()]
        self.eos_token_ids = tuple(dict.fromkeys(model.eos_token_ids + tokenizer.eos_token_ids))
        self.fim_family: FimFamily | None = detect_fim_family(tokenizer)
        geometry = KVGeometry.from_pairs(spec.kv_pairs)
        page_bytes = max(geometry.page_bytes(config.kv_page_size), 1)
        self.pool = PagePool(geometry, config.kv_page_size,
                             max(1, config.kv_cache_bytes // page_bytes))
        reuse = config.prefix_cache and self.runner.transfers_kv
        self.prefix_cache: PrefixCache | None = PrefixCache(self.pool) if reuse else None
        self.sessions = SessionStore(self.pool, self.prefix_cache)
        self.governor = make_governor(config, session_info.provider, page_bytes,
                                      model.weights_bytes)
        self.pool.admit = page_admitter(self)
        self.kv_tiers: KVTiers | None = None
        if config.kv_store is not None and self.runner.transfers_kv:
            kv_dtype = spec.kv_pairs[0].dtype
            self.kv_tiers = KVTiers(config.kv_store,
                                    model_identity(model, session_info.provider, kv_dtype),
                                    on_gpu=session_info.provider in ("cuda", "directml"))
        shifter, self.kv_shift = make_shifter(model, spec, self.context_length,
                                              config.cache_reuse if reuse else 0)
        self.reuse = KVReuse(self.pool, self.prefix_cache, self.sessions, self.kv_tiers,
                             shifter, config.prefill_chunk_size)

    @classmethod
    def load(cls, model_dir: str | Path, config: EngineConfig | None = None) -> Engine:
        """Open the model folder (engine/loading.py: the steps of a load), then the engine
        on it, with its speculative head or draft model and huge pages as configured."""
        config = config or EngineConfig()
        opened = open_model(model_dir, config)
        engine = cls(opened.model, opened.tokenizer, opened.session, opened.info, opened.spec,
                     config, graph_capture=opened.capture)
        engine.placement_reason = opened.placement.reason
        engine.kernel_use = opened.kernel_use
        engine.declared_head = head = opened.head
        placement = opened.placement
        if head is not None and head.executable:
            engine.mtp_head = MtpHead.load(head, config, placement.provider)
            for runner in engine.runners:
                runner.track_hidden(engine.mtp_head.hidden_output, engine.mtp_head.hidden_size)
        if config.draft_model is not None:
            engine.draft_runner = load_draft_runner(config.draft_model, engine, placement.provider)
        if config.huge_pages and engine.provider == "cpu":
            engine._huge_pages = BackgroundAdvice()
        engine.cpu_share = cpu_share.for_engine(config, engine.provider, engine.kernel_use,
                                                engine.session_info.threads)
        return engine

    @property
    def exact_paths(self) -> bool:
        """Whether every GroupQueryAttention and MatMulNBits node runs the engine's kernels:
        then a step of several rows (a batch, a prefill chunk, a verify pass) gives each
        row the bits of a one-row step, and an answer does not depend on its path."""
        use = self.kernel_use  # attention in other operators than GroupQueryAttention: no
        return use is not None and use.status.ready and 0 < use.moved == use.nodes \
            and use.matmul_moved == use.matmul_nodes

    @property
    def huge_pages(self) -> HugePageReport | None:
        """The load's huge-page report; None: not asked, not on the CPU, or still running."""
        return None if self._huge_pages is None else self._huge_pages.report

    def wait_huge_pages(self, timeout: float | None = None) -> bool:
        """Wait for the background huge-page collapse; True when done or never started."""
        return self._huge_pages is None or self._huge_pages.wait(timeout)

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler that runs this engine's requests together (created on first use)."""
        return Scheduler.of(self)

    @property
    def runner(self) -> DecodeRunner:
        return self.runners[0]

    def add_runner(self) -> DecodeRunner | None:
        """Another runner for a concurrent sequence; None at `config.max_batch` or when the
        memory budget has no room for it (a new bank row is allocated at once)."""
        if len(self.runners) >= self.config.max_batch:
            return None
        first = self.runners[0]
        row_bytes = first.capacity * self.spec.kv_bytes_per_token \
            if isinstance(first.kv_runner, SharedBufferRunner) else 0
        if not self.governor.can_allocate(self.governor.kv_tier, row_bytes):
            return None
        runner = self._new_runner()
        if self.mtp_head is not None:
            runner.track_hidden(self.mtp_head.hidden_output, self.mtp_head.hidden_size)
        self.runners.append(runner)
        self._report_kv()
        return runner

    @property
    def provider(self) -> str:
        return self.session_info.provider

    @property
    def decode_path(self) -> str:
        return self.spec.decode_path

    # --- prompts ----------------------------------------------------------------------

    def encode_request(self, request: GenerateRequest) -> list[int]:
        return encode_request(self.tokenizer, request, self.spec.vocab_size)

    def stop_ids(self, request: GenerateRequest) -> tuple[int, ...]:
        """The token ids that end this request (``engine.generation.prompt.stop_ids``)."""
        return stop_ids(self.tokenizer, request, self.eos_token_ids)

    def max_total(self, options: GenerateOptions) -> int:
        return min(options.max_context or self.runner.context_length, self.runner.context_length)

    def request_total(self, prompt_len: int, options: GenerateOptions) -> int:
        """The tokens a request's KV may reach: its prompt and every token it may generate,
        capped by the context."""
        return min(self.max_total(options), prompt_len + options.max_new_tokens)

    def request_reservation(self, prompt_len: int, options: GenerateOptions) -> int:
        """The tokens a request's KV gets when it starts (`pressure.reservation`)."""
        return reservation(self.request_total(prompt_len, options), self.max_total(options),
                           prompt_len, self.config.kv_reserve_ahead)

    def fim_request(
        self, prefix: str, suffix: str, options: GenerateOptions | None = None, *,
        order: FimOrder | None = None, extra_files: Sequence[FimFile] = (),
        repo_name: str | None = None, file_path: str | None = None,
        lines: FimLines = "auto", budget: int | None = None,
    ) -> GenerateRequest:
        """A fill-in-the-middle request in the model's own layout; FIM tokens stop it.
        ``order`` None: the order the model declares (``fim_order`` in its
        tokenizer_config.json), else prefix-suffix-middle.

        A model without FIM tokens gets the prefix-only layout (``engine.generation.fim_plain``): a
        :class:`~engine.fim_plain.PrefixOnlyRequest` whose answer ``lines`` ("auto",
        "single", "multi") and the suffix shape; ``budget`` caps its prompt tokens.
        ``order``, ``repo_name`` and ``file_path`` do not apply there.
        """
        options = options or GenerateOptions()
        return fim_request(self.tokenizer, prefix, suffix, options,
                           max_total=self.max_total(options), eos_token_ids=self.eos_token_ids,
                           order=order, extra_files=extra_files, repo_name=repo_name,
                           file_path=file_path, lines=lines, budget=budget)

    # --- generation -------------------------------------------------------------------

    def stream(self, request: GenerateRequest,
               cancel: threading.Event | None = None) -> EventStream:
        """Generate, yielding an event per token and a final event with the result.
        A prefix-only infill (``fim_request`` on a model without FIM tokens) streams its
        answer through its completion rules (``engine.text.fim_trim``)."""
        started = time.perf_counter()
        trimmer = trimmer_for(request)
        if trimmer is None:
            return self._stream(request, self.encode_request(request), None, cancel, started)
        stop = stop_flag(cancel)
        events = self._stream(request, self.encode_request(request), None, stop, started)
        return trim_events(events, trimmer, stop)

    def generate(self, request: GenerateRequest,
                 cancel: threading.Event | None = None) -> GenerateResult:
        return _result_of(self.stream(request, cancel))

    def _stream(self, request: GenerateRequest, prompt: list[int], session: Session | None,
                cancel: threading.Event | None, started: float) -> EventStream:
        fitted = self.fit_prompt(prompt, request.options, session is not None)
        return self._run(request, fitted, session, cancel, started, len(prompt) - len(fitted))

    def fit_prompt(self, prompt: list[int], options: GenerateOptions,
                   in_session: bool = False) -> list[int]:
        """The prompt if it fits the context; with `truncate_prompt`, its newest tokens
        (room left for max_new_tokens); else ContextOverflowError with the numbers."""
        max_total = self.max_total(options)
        if len(prompt) < max_total:
            return prompt
        if not options.truncate_prompt or in_session:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; the context holds {max_total}, leaving "
                "no room for an answer", hint="shorten the prompt, raise max_context, or "
                "allow truncation (truncate_prompt)")
        keep = max(1, max_total - options.max_new_tokens)
        return prompt[len(prompt) - keep:]

    def start_run(self, request: GenerateRequest, prompt: list[int], session: Session | None,
                  cancel: threading.Event | None, started: float,
                  runner: DecodeRunner | None = None, dropped: int = 0) -> RequestRun:
        """Reuse what KV can be reused on `runner`, and set up the request's token loop."""
        runner = runner or self.runner
        total = self.request_reservation(len(prompt), request.options)
        ensure_room(self, runner, total)  # before reuse imports KV, and after it cached pages
        cached = self.reuse.prepare(runner, prompt, session)
        ensure_room(self, runner, total)
        run = RequestRun(request, prompt, runner=runner, tokenizer=self.tokenizer,
                         dropped=dropped, draft_runner=self.draft_runner,
                         mtp_head=self.mtp_head,
                         eos=self.stop_ids(request), max_total=self.max_total(request.options),
                         chunk_size=self.config.prefill_chunk_size, cached=cached,
                         cancel=cancel, started=started, reserve=total,
                         grow=functools.partial(grow_reservation, self),
                         grow_step=self.config.kv_grow_tokens, exact=self.exact_paths)
        run.cached -= self.reuse.computed  # gaps between shifted runs were computed
        run.clock.prefill_tokens += self.reuse.computed
        self._report_kv()  # the runner reserved its KV: the budget sees it now
        self._watchers(begin=True)
        return run

    def _run(self, request: GenerateRequest, prompt: list[int], session: Session | None,
             cancel: threading.Event | None, started: float, dropped: int) -> EventStream:
        run = self.start_run(request, prompt, session, cancel, started, dropped=dropped)
        try:
            while not run.finished:
                yield from run.advance()
        except GeneratorExit:
            self.end_run(run, session)  # the caller stopped listening
            raise
        except BaseException:
            run.runner.reset()
            self.run_ended()
            raise
        self.end_run(run, session)
        yield from run.closing_events()

    # --- memory -----------------------------------------------------------------------

    def kv_bytes(self) -> int:
        """KV bytes held: every runner's buffers plus cached pages."""
        return sum(r.kv_bytes for r in self.runners) + self.pool.nbytes

    def _report_kv(self) -> None:
        self.governor.report(self.governor.kv_tier, kv_bytes=self.kv_bytes())

    def resource_snapshot(self) -> GovernorSnapshot:
        self._report_kv()
        return self.governor.snapshot()

    def set_limit(self, tier: str, value: str) -> LimitOutcome:
        """Change a memory limit now (engine thread, between scheduler steps). Going below
        what is held evicts cached pages, spills idle sessions, then preempts less urgent
        requests (swap-style, resumed token-identical); in-progress work is never dropped:
        a request that alone exceeds the limit keeps running and the outcome says
        `still_over`, with the numbers. See `engine.scheduling.pressure`."""
        return apply_limit(self, self.active_scheduler, tier, value)

    # --- KV reuse ---------------------------------------------------------------------

    def run_ended(self) -> None:
        """A request left the engine (done or failed)."""
        self._watchers(begin=False)

    def _watchers(self, begin: bool) -> None:
        """The huge-page collapse pauses while requests run; the CPU watcher looks only then."""
        for watcher in (self._huge_pages, self.cpu_share):
            if watcher is not None:
                watcher.begin() if begin else watcher.end()

    def end_run(self, run: RequestRun, session: Session | None) -> None:
        """Save a session's new KV and history, index full pages, store chunks."""
        self.run_ended()
        self.reuse.finish(run, session)
        self._report_kv()
        self.reuse.store(run.runner)

    # --- sessions ---------------------------------------------------------------------

    def create_session(self) -> int:
        return self.sessions.create().id

    def stream_in_session(self, session_id: int, request: GenerateRequest,
                          cancel: threading.Event | None = None) -> EventStream:
        """Continue a session: the request's prompt is appended to its history and only
        tokens whose KV the session lacks are prefilled."""
        started = time.perf_counter()
        session = self.sessions.get(session_id)
        prompt = session.tokens + self.encode_request(request)
        return self._stream(request, prompt, session, cancel, started)

    def generate_in_session(self, session_id: int, request: GenerateRequest,
                            cancel: threading.Event | None = None) -> GenerateResult:
        return _result_of(self.stream_in_session(session_id, request, cancel))

    def session_token_count(self, session_id: int) -> int:
        return len(self.sessions.get(session_id).tokens)

    def rewind_session(self, session_id: int, n_tokens: int) -> None:
        """Drop the last `n_tokens` of a session (e.g. to regenerate an answer)."""
        session = self.sessions.get(session_id)
        if not 0 <= n_tokens <= len(session.tokens):
            raise InvalidPromptError(
                f"cannot rewind {n_tokens} tokens of a session holding {len(session.tokens)}",
                hint="rewind at most session_token_count() tokens")
        self.sessions.truncate(session, len(session.tokens) - n_tokens)

    def reset_session(self, session_id: int) -> None:
        self.sessions.truncate(self.sessions.get(session_id), 0)

    def fork_session(self, session_id: int) -> int:
        """A new session with the same history (pages shared, copied on write)."""
        return self.sessions.fork(session_id).id

    def close_session(self, session_id: int) -> None:
        self.sessions.close(session_id)

    def close(self) -> None:
        """Release what outlives requests (the KV store's files stay for the next start)."""
        if self.kv_tiers is not None:
            self.kv_tiers.close()
        if self._huge_pages is not None:  # another engine's requests would not pause it
            self._huge_pages.stop()

    def describe(self) -> Mapping[str, object]:
        return {"model": str(self.model.path), "provider": self.provider,
                "placement_reason": self.placement_reason,
                "threads": self.session_info.threads, "decode_path": self.decode_path,
                "context_length": self.context_length,
                # the input asking for the last rows' logits only (engine.model.graph_passes)
                "logits_to_keep": self.spec.logits_to_keep,
                "kv": {"dtype": self.spec.kv_pairs[0].dtype if self.spec.kv_pairs else None,
                       "bytes_per_token": self.spec.kv_bytes_per_token,  # a window: its rows
                       "window": w.as_dict() if (w := self.runner.window) else None},
                **describe_device(self.graph_capture, self.runner),
                "speculative_head": None if self.declared_head is None
                else self.declared_head.describe(),
                "huge_pages": self.huge_pages.as_dict() if self.huge_pages is not None  # or
                else "pending" if self._huge_pages is not None else None,  # running, or none
                # whether the engine's own attention kernel runs, and why not where it does not
                "engine_kernels": None if self.kernel_use is None
                else self.kernel_use.as_dict(),
                # reuse by shifting (engine.kv.shift): on, and how the keys are rotated
                "kv_shift": {**self.kv_shift.as_dict(), "min_run": self.config.cache_reuse},
                "cpu_share": None if self.cpu_share is None else self.cpu_share.as_dict()}


def _result_of(events: Iterator[GenerateEvent]) -> GenerateResult:
    for event in events:
        if event.result is not None:
            return event.result
    raise AssertionError("stream ended without a result")
