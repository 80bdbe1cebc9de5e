"""The governor inside the engine: refusals with numbers, live limit changes."""

import gc

import psutil
import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.errors import InvalidOptionError, ResourceLimitError
from engine.scheduling.scheduler import Scheduler
from tests.forge import ForgeSpec, write_genai_model

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def wide_kv_model(tmp_path_factory):
    # 4 layers x 8 KV heads x 64 dims x f32: 16 KiB of KV per token
    spec = ForgeSpec(layers=4, hidden=128, heads=8, kv_heads=8, head_dim=64, context=2048)
    return write_genai_model(tmp_path_factory.mktemp("wide"), spec)


def _settled_rss() -> int:
    """This process's resident set once earlier tests' garbage (their engines' KV buffers)
    is freed: freed later, between this reading and the request, it would add its megabytes
    to the room a limit set from the reading leaves."""
    gc.collect()
    return psutil.Process().memory_info().rss


def _req(n, prompt=(5, 6, 7, 8)):
    return GenerateRequest(token_ids=prompt, options=GenerateOptions(
        max_new_tokens=n, temperature=0.0, stop_on_eos=False))


def test_limit_below_the_weights_refuses_to_load_with_numbers(tmp_path):
    # vocab 8192 x hidden 128 in f32: 8 MiB of embedding and output weights
    spec = ForgeSpec(vocab=8192, hidden=128, heads=4, kv_heads=2)
    folder = write_genai_model(tmp_path / "m", spec, tokenizer_vocab=512)
    with pytest.raises(ResourceLimitError, match="raise") as err:
        Engine.load(folder, EngineConfig(host_ram_limit="4MiB"))
    assert "MiB" in str(err.value)


def test_bad_limit_text_lists_the_accepted_forms():
    with pytest.raises(InvalidOptionError, match="GiB"):
        EngineConfig(host_ram_limit="lots")


def test_request_needing_more_kv_than_the_limit_is_refused_others_run(wide_kv_model):
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1))
    engine.generate(_req(2))
    rss = _settled_rss()
    engine.set_limit("host_ram", f"{(rss + 12 * MIB) // MIB}MiB")
    with pytest.raises(ResourceLimitError) as err:  # ~2,000 tokens x 16 KiB = 32 MiB
        engine.generate(_req(1900))
    message = str(err.value)
    assert "MiB" in message and "host-ram-limit" in message
    assert len(engine.generate(_req(20)).token_ids) == 20  # a small request still fits


def test_lowering_the_limit_evicts_cached_pages_and_reports_it(wide_kv_model):
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, kv_page_size=16))
    for start in range(0, 400, 100):  # four different prompts fill the prefix cache
        engine.generate(_req(4, tuple(range(start + 10, start + 90))))
    assert engine.prefix_cache is not None and engine.prefix_cache.idle_pages > 0
    held = engine.kv_bytes()
    snap = engine.resource_snapshot().host_ram
    assert snap is not None and snap.kv_bytes == held
    reported = snap.weights_bytes + snap.kv_bytes  # what the engine holds and can free
    outcome = engine.set_limit("host_ram", str(reported - engine.pool.nbytes // 2))
    assert outcome.change.excess_bytes > 0
    assert outcome.pages_evicted > 0 and outcome.bytes_freed >= outcome.change.excess_bytes
    assert engine.kv_bytes() < held and not outcome.still_over


def test_halving_the_limit_mid_generation_keeps_the_output(wide_kv_model):
    solo = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, prefix_cache=False))
    expected = solo.generate(_req(60)).token_ids
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1))
    scheduler = Scheduler(engine)
    events: list = []
    scheduler.submit(_req(60), events.append)
    for _ in range(20):
        scheduler.step()
    snap = engine.resource_snapshot().host_ram
    outcome = engine.set_limit("host_ram", str((snap.weights_bytes + snap.kv_bytes) // 2))
    assert outcome.change.excess_bytes > 0
    assert outcome.still_over  # the weights alone exceed half: reported, not hidden
    while scheduler.step():
        pass
    assert events[-1].result.token_ids == expected


def test_runtime_override_off_refuses_live_changes(genai_model_dir):
    engine = Engine.load(genai_model_dir, EngineConfig(runtime_override=False))
    with pytest.raises(ResourceLimitError, match="runtime override"):
        engine.set_limit("host_ram", "50%")


def test_a_request_without_room_waits_for_running_ones_then_is_refused(wide_kv_model):
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, max_batch=2))
    scheduler = Scheduler(engine)
    small: list = []
    big: list = []
    scheduler.submit(_req(40), small.append)
    scheduler.step()  # the small request runs and holds its KV
    rss = _settled_rss()
    engine.set_limit("host_ram", f"{rss // MIB + 1}MiB")
    scheduler.submit(_req(1900, prompt=(9, 10, 11)), big.append)  # ~30 MiB of KV: no room
    scheduler.step()
    assert not big  # waiting (for a runner or for room), not refused while others run
    while scheduler.step():
        pass
    assert small[-1].result is not None and len(small[-1].result.token_ids) == 40
    assert len(big) == 1 and isinstance(big[0], ResourceLimitError)  # refused with numbers
    assert "MiB" in str(big[0])


def test_no_new_batch_row_without_room(wide_kv_model):
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, max_batch=4))
    engine.generate(_req(600))  # the bank holds 640 tokens x 16 KiB = 10 MiB per row
    rss = _settled_rss()
    engine.set_limit("host_ram", f"{rss // MIB + 2}MiB")
    assert engine.add_runner() is None  # a second 10 MiB row does not fit in ~2 MiB
    engine.set_limit("host_ram", "auto")
    assert engine.add_runner() is not None and len(engine.runners) == 2


def test_a_spilled_session_resumes_from_the_disk_tier(wide_kv_model, tmp_path):
    from engine.config import KVStoreConfig

    store = KVStoreConfig(chunk_tokens=16, disk_dir=str(tmp_path / "kv"), ram_bytes=0)
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, kv_store=store,
                                                     prefix_cache=False))
    solo = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, prefix_cache=False))
    sid = engine.create_session()
    first = engine.generate_in_session(sid, _req(8, tuple(range(20, 70))))
    engine.generate(_req(4, (3, 4, 5)))  # another request takes the runner
    snap = engine.resource_snapshot().host_ram
    outcome = engine.set_limit("host_ram", str(snap.weights_bytes + snap.kv_bytes - 1))
    assert outcome.sessions_spilled == 1  # its pages were dropped...
    engine.set_limit("host_ram", "auto")  # the slider goes back up
    second = engine.generate_in_session(sid, _req(6, (7, 8)))
    history = list(range(20, 70)) + list(first.token_ids) + [7, 8]
    assert second.prefix_cache_hit_len >= 48  # ...and its KV came back from disk
    assert second.token_ids == solo.generate(_req(6, tuple(history))).token_ids


def _fixed_ram(engine, total=64 << 30):
    """Capacity as fixed numbers, without the process's RSS: room is exactly the limit
    minus what the engine reported (weights + KV), so the KV budget binds."""
    from engine.memory.capacity import CapacityProviders, FixedCapacity, UnknownCapacity

    engine.governor.use_providers(CapacityProviders(
        vram=UnknownCapacity("VRAM", "cpu"), host_ram=FixedCapacity(total, 0)))


def _solo_ids(folder, request, kv_dtype="auto"):
    solo = Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False,
                                            kv_dtype=kv_dtype))
    return solo.generate(request).token_ids


@pytest.mark.parametrize("spill", ["recompute", "kv_store"])
def test_lowering_the_limit_to_half_preempts_the_low_priority_request(wide_kv_model, spill,
                                                                      tmp_path):
    """Two requests of different priorities; the limit drops to half of what is in use:
    the low-priority one is swapped out (its KV to the tiered store when there is one, else
    recomputed from its kept tokens), waits for room, and both match their solo runs."""
    from engine.config import KVStoreConfig

    long_low, short_high = _req(300, (5, 6, 7, 8)), _req(40, (9, 10, 11))
    # float32 KV: half of what is in use then leaves the high-priority request room (in
    # float16 the weights are a larger part of it)
    expected = [_solo_ids(wide_kv_model, r, "float32") for r in (long_low, short_high)]
    store = KVStoreConfig(chunk_tokens=4, disk_dir=str(tmp_path / "kv"), ram_bytes=0)
    engine = Engine.load(wide_kv_model, EngineConfig(
        intra_op_threads=1, max_batch=2, kv_store=store if spill == "kv_store" else None,
        kv_dtype="float32"))
    _fixed_ram(engine)
    scheduler = Scheduler(engine)
    low: list = []
    high: list = []
    scheduler.submit(long_low, low.append, priority="low")
    scheduler.submit(short_high, high.append, priority="high")
    for _ in range(12):
        scheduler.step()
    assert len(scheduler.active) == 2  # both generate
    held = engine.kv_bytes()
    snap = engine.resource_snapshot().host_ram
    assert snap is not None
    use = snap.weights_bytes + held
    outcome = engine.set_limit("host_ram", f"{use // 2}B")  # half of what is in use
    assert outcome.change.excess_bytes > 0
    assert outcome.requests_preempted == 1 and not outcome.still_over, outcome
    assert outcome.bytes_freed >= outcome.change.excess_bytes
    assert engine.kv_bytes() <= use // 2 - snap.weights_bytes
    assert [t.priority for t in scheduler.active.values()] == ["high"]
    if engine.kv_tiers is not None:  # the swapped-out KV went to the disk tier
        assert engine.kv_tiers.store.stats()["disk_entries"] >= 3
    peak = 0
    while scheduler.step():
        if len(scheduler.active) > 1 or high[-1].result is None:
            peak = max(peak, engine.kv_bytes())
    assert peak <= use // 2 - snap.weights_bytes  # under the limit while both are alive
    assert scheduler.waited_for_memory > 0  # the preempted one waited for room
    assert high[-1].result.token_ids == expected[1]
    assert low[-1].result.token_ids == expected[0]  # resumed, token-identical
    if engine.kv_tiers is not None:  # it resumed from the store, not by recomputing
        assert engine.kv_tiers.store.stats()["disk_hits"] >= 3


def test_a_single_request_over_the_new_limit_keeps_running(wide_kv_model):
    request = _req(200)
    expected = _solo_ids(wide_kv_model, request)
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1))
    _fixed_ram(engine)
    scheduler = Scheduler(engine)
    events: list = []
    scheduler.submit(request, events.append, priority="low")
    for _ in range(10):
        scheduler.step()
    snap = engine.resource_snapshot().host_ram
    assert snap is not None
    limit = snap.weights_bytes + engine.kv_bytes() // 4  # above the weights, below its KV
    outcome = engine.set_limit("host_ram", f"{limit}B")
    assert outcome.requests_preempted == 0  # the only request is never preempted
    assert outcome.still_over and "over the limit" in outcome.detail
    assert "MiB" in outcome.detail or "KiB" in outcome.detail
    while scheduler.step():
        pass
    assert events[-1].result.token_ids == expected  # nothing in progress was lost


def _open_req(context):
    """A request bounded by the context alone, as the worker sends one without max_tokens."""
    return GenerateRequest(token_ids=(5, 6, 7, 8), options=GenerateOptions(
        max_new_tokens=context, max_context=context, temperature=0.0, stop_on_eos=False))


def test_an_answer_without_max_tokens_reserves_kv_as_it_grows(wide_kv_model):
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1))
    per_token = engine.runners[0].spec.kv_bytes_per_token
    context = engine.context_length  # 2048 tokens: 32 MiB of KV
    events = engine.stream(_open_req(context))
    next(events)  # the first token: the request holds its first reservation
    held_at_start = engine.kv_bytes()
    assert held_at_start <= context * per_token // 4  # not the whole context
    *_, last = events
    result = last.result
    assert result is not None and result.finish_reason.kind == "length"
    assert len(result.token_ids) == context - 4  # it ran past the first reservation,
    assert engine.kv_bytes() > held_at_start  # growing as it went


def test_an_answer_whose_growth_the_limit_refuses_ends_with_length(wide_kv_model):
    engine = Engine.load(wide_kv_model, EngineConfig(intra_op_threads=1, prefix_cache=False))
    _fixed_ram(engine)
    context = engine.context_length
    events = engine.stream(_open_req(context))
    next(events)
    snap = engine.resource_snapshot().host_ram
    assert snap is not None  # room for what it holds now, and no more
    engine.set_limit("host_ram", f"{snap.weights_bytes + snap.kv_bytes}B")
    *_, last = events
    result = last.result
    assert result is not None and result.finish_reason.kind == "length"
    assert 256 <= len(result.token_ids) < context // 2  # its first reservation, then no more
    assert engine.generate(_req(8)).finish_reason.kind == "max_tokens"  # the engine goes on
