"""Memory pressure: executing a lowered limit, and the page allocator's live budget check.

`apply_limit` is what `Engine.set_limit` does (the memory slider). Going below what the
engine holds frees, in this order, until it is back under the limit:

1. idle prefix-cache pages are evicted;
2. idle sessions' KV pages are dropped (their token history stays; the tiered store, when
   configured, holds copies that the next turn fetches, else it is recomputed);
3. the KV of waiting (already preempted) requests is released, and idle runners' live
   slots are dropped; the runner buffers shrink to what running requests reserved;
4. running requests are preempted, least urgent first (lower priority, then newer):
   swap-style, their KV goes to pages within the new limit when there is room, else to
   the tiered store (or it is recomputed from the kept tokens), their state is kept and
   they resume, token-identical, when there is room again. The most urgent running
   request is never preempted: something always makes progress.

What is in progress is never lost because a limit moved. When a single running request
alone holds more than the new limit, it keeps running to its end; the outcome says
`still_over`, with the numbers in `detail`. A preempted request resumes when there is room,
or when nothing else runs (then alone, even above the limit, for the same reason).
Only a *new* request that cannot fit while nothing runs is refused, with the numbers.
After every scheduler step `relieve` frees idle KV again if the engine is over its limit,
and `make_room` frees idle KV (never running requests) before any new KV is reserved.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.memory.governor import Limit, LimitOutcome, format_bytes
from engine.runtime.decode_gqa import SharedBufferRunner
from engine.runtime.runner import GROW_STEP, DecodeRunner
from engine.scheduling.core import EngineCore, Preemptor


def report_kv(engine: EngineCore) -> None:
    """Tell the governor what KV the engine holds now."""
    engine.governor.report(engine.governor.kv_tier, kv_bytes=engine.kv_bytes())


def _under_limit(engine: EngineCore, tier: str) -> Callable[[], bool]:
    """A check of the KV held now (reported first) against `tier`'s limit."""
    def under() -> bool:
        report_kv(engine)
        return engine.governor.over_limit(tier) == 0
    return under


def page_admitter(engine: EngineCore) -> Callable[[int], bool]:
    """The page pool's `admit`: is there room for `nbytes` more, counting what is held
    now (not what was last reported), so no run of page allocations overshoots."""
    def admit(nbytes: int) -> bool:
        report_kv(engine)
        return engine.governor.can_allocate(engine.governor.kv_tier, nbytes)
    return admit


def apply_limit(engine: EngineCore, scheduler: Preemptor | None, tier: str,
                value: str | int | float | Limit) -> LimitOutcome:
    """Set a limit now (engine thread, between scheduler steps) and execute it; see the
    module docstring for the order. Returns what was freed, evicted, spilled, preempted,
    and whether (and by how much) the engine is still over."""
    report_kv(engine)
    governor = engine.governor
    change = governor.set_limit(tier, value)
    before, pages, spilled, preempted = engine.kv_bytes(), 0, 0, 0
    under = _under_limit(engine, change.tier)
    if change.excess_bytes > 0 and change.tier == governor.kv_tier:
        pages, spilled = free_idle(engine, scheduler, under)
        budget = governor.budget(change.tier)  # no KV fits at all: preempting is futile
        if not under() and scheduler is not None and (budget is None or budget.kv_bytes):
            preempted = scheduler.preempt_for_memory(
                lambda: not under(), lambda: fit_buffers(engine, scheduler))
    report_kv(engine)
    excess = governor.over_limit(change.tier)
    return LimitOutcome(change, bytes_freed=before - engine.kv_bytes(), pages_evicted=pages,
                        sessions_spilled=spilled, requests_preempted=preempted,
                        still_over=excess > 0, detail=_still_over(engine, change.tier, excess))


def free_idle(engine: EngineCore, scheduler: Preemptor | None,
              enough: Callable[[], bool]) -> tuple[int, int]:
    """Free idle KV, in this order, until `enough()`: prefix-cache pages, idle sessions'
    pages, waiting requests' parked pages, idle runners' slots and unreserved buffer
    space. Running requests are not touched. Returns (pages evicted, sessions spilled)."""
    cache = engine.prefix_cache

    def evict() -> int:  # dropped sessions and parked requests leave pages idle in it
        freed = 0
        while cache is not None and cache.idle_pages and not enough() and cache.evict(1):
            freed += 1
        return freed

    pages, spilled = evict(), 0
    for session in engine.sessions.idle():
        if enough():
            break
        engine.sessions.drop_kv(session)
        spilled += 1
        pages += evict()
    if scheduler is not None and not enough():
        scheduler.release_parked_kv()
        pages += evict()
    if not enough():
        fit_buffers(engine, scheduler)
    return pages, spilled


def relieve(engine: EngineCore, scheduler: Preemptor | None) -> None:
    """Between steps: when the engine holds more than its limit (a lone request ran over
    it, or memory moved), free idle KV until it is back under."""
    under = _under_limit(engine, engine.governor.kv_tier)
    if not under():
        free_idle(engine, scheduler, under)


def make_room(engine: EngineCore, scheduler: Preemptor | None, runner: DecodeRunner,
              total: int) -> bool:
    """Free idle KV (`free_idle`) until `runner` can hold `total` tokens under the budget
    and the engine is not over its limit. True when it fits."""
    governor = engine.governor

    def fits() -> bool:
        report_kv(engine)
        if governor.over_limit(governor.kv_tier):
            return False
        growth = runner.growth_bytes(total)  # none (the usual case): no reading to take
        return growth == 0 or governor.can_allocate(governor.kv_tier, growth)

    free_idle(engine, scheduler, fits)
    return fits()


def ensure_room(engine: EngineCore, runner: DecodeRunner, total: int) -> None:
    """`make_room`, else ResourceLimitError with the numbers (the scheduler waits on it
    while others run, and refuses a new request with it when nothing runs)."""
    if not make_room(engine, engine.active_scheduler, runner, total):
        tier = engine.governor.kv_tier
        raise engine.governor.no_room_error(tier, runner.growth_bytes(total))


def reservation(total: int, max_total: int, prompt_len: int, ahead: int) -> int:
    """The tokens a request's KV gets when it starts, of the ``total`` it may reach. An
    answer bounded by its max_new_tokens gets them all (it fits whole, or it is refused
    with the numbers before it starts). One bounded by the context alone (``total`` is
    ``max_total``: a request without max_tokens) gets its prompt and ``ahead`` tokens, and
    the rest as it grows while the memory limit allows (`grow_reservation`): reserving the
    whole context for every such request would hold memory for answers mostly short."""
    return total if total < max_total else min(total, prompt_len + ahead)


def grow_reservation(engine: EngineCore, runner: DecodeRunner, total: int) -> bool:
    """Room for `total` tokens on `runner` within the memory limit (idle KV is freed
    first, running requests are not touched); False when the limit refuses."""
    if not make_room(engine, engine.active_scheduler, runner, total):
        return False
    runner.reserve(total)
    report_kv(engine)
    return True


def fit_buffers(engine: EngineCore, scheduler: Preemptor | None) -> None:
    """Drop idle runners' live slots and fit shared KV buffers to what running requests
    reserved (so they never have to grow unchecked). Without a scheduler (a direct
    `Engine.stream`), only the unused tail of the buffers goes."""
    rows = [r.kv_runner for r in engine.runners]
    banks = {id(r.bank): r.bank for r in rows if isinstance(r, SharedBufferRunner)}
    if scheduler is None:
        for bank in banks.values():
            bank.shrink()
        return
    reserved: dict[int, int] = {}
    for run in scheduler.running():
        reserved[id(run.runner.kv_runner)] = max(run.sequence.reserved, run.runner.length)
    for runner in engine.runners:
        if id(runner) not in reserved:
            runner.reset()
    for bank in banks.values():
        need = max((reserved.get(id(r), 0) for r in bank.runners), default=0)
        cap = min(bank.context_length, max(GROW_STEP, -(-need // GROW_STEP) * GROW_STEP))
        if cap < bank.cap:
            bank.resize(len(bank.runners), cap)


def _still_over(engine: EngineCore, tier: str, excess: int) -> str:
    if excess <= 0:
        return ""
    snap = engine.governor.tier_snapshot(tier)
    limit = None if snap is None else snap.limit
    held = engine.kv_bytes()
    return (f"still {format_bytes(excess)} over the limit of {format_bytes(limit)}: "
            f"weights {format_bytes(snap.weights_bytes if snap else 0)}, KV held "
            f"{format_bytes(held)} by the request that runs on (nothing in progress is "
            "dropped); the memory goes back when it finishes, or raise the limit")
