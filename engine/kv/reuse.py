"""Where a prompt's prefix KV comes from, and where a finished sequence's KV goes.

Sources, longest wins: the runner's own cache (the live slot), the session's pages, the
prefix cache, the tiered store. Finished sequences leave their pages to the session, the
prefix cache (when their runner moves on) and the tiered store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from engine.generation.request import RequestRun
from engine.kv.cache import (
    NoRoomError,
    PagePool,
    PageTable,
    PrefixCache,
    append_rows,
    read_any_rows,
    read_rows,
    release_page,
)
from engine.kv.sessions import Session, SessionStore
from engine.kv.shift import RowReader, Segment, Shifter, ShiftPlan
from engine.kv.tiers import KVTiers
from engine.runtime.runner import DecodeRunner

log = logging.getLogger(__name__)


def common_prefix_len(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading ids `a` and `b` share (at most `limit`). Compares blocks of ids
    first (a list comparison runs in C), then ids one by one in the block that differs:
    an editor's 2,000-token prompt costs a few µs, not a Python loop over every id."""
    n = min(len(a), len(b), limit)
    at, block = 0, 256
    while at < n:
        end = min(at + block, n)
        if list(a[at:end]) != list(b[at:end]):
            break
        at = end
    for i in range(at, min(at + block, n)):
        if a[i] != b[i]:
            return i
    return n


class KVReuse:
    def __init__(self, pool: PagePool, prefix_cache: PrefixCache | None,
                 sessions: SessionStore, kv_tiers: KVTiers | None,
                 shifter: Shifter | None = None, chunk: int = 512) -> None:
        self.pool = pool
        self.prefix_cache = prefix_cache
        self.sessions = sessions
        self.kv_tiers = kv_tiers
        #: Reuse by shifting (engine.kv.shift); None = off or not derivable for the model.
        self.shifter = shifter
        self.chunk = chunk
        #: Of the tokens the last `prepare` put in the runner, those computed (the gaps
        #: between shifted runs), not reused.
        self.computed = 0
        #: Tokens reused by shifting, over the engine's life.
        self.shifted_tokens = 0

    def prepare(self, runner: DecodeRunner, prompt: list[int],
                session: Session | None) -> int:
        """Put the KV of the longest prefix of `prompt` it can into `runner`: reused from
        a cache, shifted from other positions, or computed between shifted runs (counted
        in `computed`); return its length."""
        aside = self.sessions.take_aside(session) if session is not None else None
        try:
            plan = self._shift_plan(runner, prompt, aside)
            held = self._prefix(runner, prompt, session)
            self.computed = 0
            if plan is not None and plan.reused_after(held) >= plan.min_run:
                self.shifted_tokens += plan.reused_after(held)
                self.computed = plan.apply(runner, prompt, self.chunk)
                held = runner.length
            return held
        finally:
            if aside is not None:
                self.sessions.release_table(aside[1])

    def _shift_plan(self, runner: DecodeRunner, prompt: list[int],
                    aside: tuple[list[int], PageTable] | None) -> ShiftPlan | None:
        """The best shift plan over the runner's live KV and a session's set-aside KV, its
        runs copied (the prefix step may overwrite the runner's rows)."""
        shifter = self.shifter
        if shifter is None or not runner.transfers_kv or runner.window is not None:
            return None  # a window's rows past its sinks are not a fresh computation's
        min_run = shifter.min_run_for(len(prompt))
        if len(prompt) <= min_run:
            return None
        limit = len(prompt) - 1
        sources: list[tuple[Sequence[int], RowReader]] = [(runner.tokens, runner.export_kv)]
        if aside is not None:
            tokens, table = aside
            sources.append((tokens[:table.length],
                            lambda a, b: read_any_rows(self.pool, table, a, b)))
        best: tuple[int, list[Segment], RowReader] | None = None
        for cached, read in sources:
            reused, segments = shifter.plan(cached, prompt, limit)
            first = segments[0].length if segments and segments[0].at == 0 and \
                segments[0].src == 0 else 0
            if reused - first >= min_run and (best is None or reused > best[0]):
                best = (reused, segments, read)
        if best is None:
            return None
        return shifter.copy(best[1], best[2], min_run)

    def _prefix(self, runner: DecodeRunner, prompt: list[int],
                session: Session | None) -> int:
        """Put the longest reusable prefix of `prompt` into `runner`; return its length."""
        size = self.pool.page_size
        limit = len(prompt) - 1  # at least one prompt token always runs
        live = runner.reachable(common_prefix_len(runner.tokens, prompt, limit))
        if self.prefix_cache is not None and live < len(runner.tokens) // 2:
            # The runner moves on to another sequence: keep the old one's pages findable.
            # (Continuing the same document keeps its KV live and copies nothing.)
            self.publish(runner)
        best, source = live, None
        if session is not None and runner.transfers_kv and min(session.kv_len, limit) > best:
            best, source = min(session.kv_len, limit), session.table
        if self.prefix_cache is not None and limit - best >= size:
            pages, _ = self.prefix_cache.lookup(prompt, limit)
            if len(pages) * size > best:
                best, source = len(pages) * size, PageTable(pages, len(pages) * size)
        tiers = self.kv_tiers
        if tiers is not None and limit - best >= tiers.chunk:
            keys = tiers.available(prompt, limit)
            if len(keys) * tiers.chunk > best:
                start = (live // tiers.chunk) * tiers.chunk
                runner.rewind(runner.length - start)
                return tiers.fetch_into(runner, prompt, keys, start)
        start = live if source is None else (live // size) * size
        runner.rewind(runner.length - start)
        if source is not None:
            rows = read_rows(self.pool, source, start, best)
            runner.import_kv(rows, start, prompt[start:best])
        return best

    def save_session(self, runner: DecodeRunner, session: Session) -> None:
        """Append the rows a session's pages lack; index its full pages."""
        held = runner.tokens[:runner.exact_length]
        if not runner.transfers_kv or session.kv_len >= len(held):
            return
        try:
            rows = runner.export_kv(session.kv_len, len(held))
            append_rows(self.pool, session.table, rows, self.prefix_cache)
        except NoRoomError:
            self.sessions.drop_kv(session)  # recomputed next turn; tokens are kept
            return
        if self.prefix_cache is not None:
            for index, h in enumerate(self.prefix_cache.chain(held[: session.kv_len])):
                self.prefix_cache.insert(h, session.table.pages[index])

    def publish(self, runner: DecodeRunner) -> None:
        """Copy the runner's full pages the prefix cache lacks into it (best effort)."""
        cache, size = self.prefix_cache, self.pool.page_size
        assert cache is not None
        for index, h in enumerate(cache.chain(runner.tokens[:runner.exact_length])):
            if cache.contains(h):
                continue
            page = self.pool.alloc()
            if page is None and cache.evict(1):
                page = self.pool.alloc()
            if page is None:
                return  # best effort: a full pool only means less reuse
            self.pool.write(page, runner.export_kv(index * size, (index + 1) * size))
            cache.insert(h, page)
            release_page(self.pool, page, cache)

    def store(self, runner: DecodeRunner) -> None:
        """Put the runner's complete chunks in the tiered store (best effort)."""
        if self.kv_tiers is None:
            return
        try:
            self.kv_tiers.save_from(runner, runner.tokens[:runner.exact_length])
        except Exception:  # the store is best effort: never fail a finished request
            log.exception("storing KV chunks failed; later requests recompute them")

    def finish(self, run: RequestRun, session: Session | None) -> None:
        """After a request: drop KV of tokens that were not output, and save a session's
        new history and KV (the last sampled token's KV computed, so the next turn
        prefills exactly its own new tokens)."""
        runner = run.runner
        # A stop inside a speculated block leaves KV of tokens that were not output.
        held = len(run.prompt) + len(run.sampled) - 1
        if runner.length > held:
            runner.rewind(runner.length - held)
        if session is None:
            return
        session.tokens = run.prompt + run.sampled
        held = len(session.tokens) - 1
        if (run.sampled and not run.cancelled and runner.transfers_kv
                and runner.length == held < runner.context_length):
            runner.forward(np.array(session.tokens[-1:], dtype=np.int64))
        self.save_session(runner, session)
