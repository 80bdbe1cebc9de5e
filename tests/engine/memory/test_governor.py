"""Resource Governor: limit parsing, resolution (clamping without inventing capacity),
budgets, per-tier used / limit / headroom, live changes and refusals.

Capacities are `FixedCapacity` numbers so the arithmetic is exact; the last tests run the
governor on this machine's real RAM and disk. (GPU capacities are fakes here: no GPU can
exist on this machine; see test_capacity.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import InvalidOptionError, ResourceLimitError
from engine.memory.capacity import (
    CapacityProviders,
    CapacityReading,
    FixedCapacity,
    UnknownCapacity,
    default_providers,
)
from engine.memory.governor import (
    AUTO,
    Governor,
    GovernorLimits,
    GovernorSnapshot,
    Limit,
    LimitOutcome,
    auto_limit,
    compute_budget,
    cuda_provider_options,
    explain_no_room,
    format_bytes,
    parse_limit,
    tier_name,
)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# -- parsing -------------------------------------------------------------------------------

ACCEPTED = [
    ("auto", AUTO, "auto"),
    (" AUTO ", AUTO, "auto"),
    ("0.5", Limit("fraction", 0.5), "0.5"),
    ("1.0", Limit("fraction", 1.0), "1.0"),
    (".25", Limit("fraction", 0.25), ".25"),
    ("50%", Limit("fraction", 0.5), "50%"),
    ("50 %", Limit("fraction", 0.5), "50%"),
    ("12.5%", Limit("fraction", 0.125), "12.5%"),
    ("100%", Limit("fraction", 1.0), "100%"),
    ("8GiB", Limit("bytes", 8 * GIB), "8GiB"),
    ("8gib", Limit("bytes", 8 * GIB), "8GiB"),
    ("8 GiB", Limit("bytes", 8 * GIB), "8GiB"),
    ("8GB", Limit("bytes", 8 * 10**9), "8GB"),
    ("8 GB", Limit("bytes", 8 * 10**9), "8GB"),
    ("8gb", Limit("bytes", 8 * 10**9), "8GB"),
    ("512MiB", Limit("bytes", 512 * MIB), "512MiB"),
    ("1.5GiB", Limit("bytes", 3 * GIB // 2), "1.5GiB"),
    ("100MB", Limit("bytes", 10**8), "100MB"),
    ("64KiB", Limit("bytes", 64 * KIB), "64KiB"),
    ("2TiB", Limit("bytes", 2 << 40), "2TiB"),
    ("1B", Limit("bytes", 1), "1B"),
    ("8589934592", Limit("bytes", 8 * GIB), "8589934592"),
    (8589934592, Limit("bytes", 8 * GIB), "8589934592"),
    (0.5, Limit("fraction", 0.5), "0.5"),
    (1.0, Limit("fraction", 1.0), "1.0"),
    (8589934592.0, Limit("bytes", 8 * GIB), "8589934592"),
]


@pytest.mark.parametrize(("text", "limit", "shown"), ACCEPTED)
def test_parse_accepts(text, limit, shown):
    parsed = parse_limit(text, field="--vram-limit")
    assert parsed == limit
    assert str(parsed) == shown
    assert parse_limit(str(parsed), field="x") == limit  # the shown form parses back


REJECTED = [
    ("", "not a limit"),
    ("   ", "not a limit"),
    ("150%", "at most 100%"),
    ("0", "greater than zero"),
    ("0%", "greater than zero"),
    ("0.0", "greater than zero"),
    ("0GiB", "greater than zero"),
    ("-1GiB", "greater than zero"),
    ("-0.5", "greater than zero"),
    ("1e9", "scientific notation"),
    ("1E9GB", "scientific notation"),
    ("8XB", "unknown unit"),
    ("8G", "unknown unit"),
    ("1.5", "at most 1"),
    ("8", "would be 8 bytes"),
    ("GiB", "not a limit"),
    ("eight GiB", "not a limit"),
    ("8 GiB extra", "not a limit"),
    ("50%%", "not a limit"),
    ("auto5", "not a limit"),
    ("0.0001B", "less than one byte"),
    (8, "would be 8 bytes"),
    (0, "greater than zero"),
    (-5, "greater than zero"),
    (1.5, "fraction 0 < f <= 1"),
    (float("nan"), "fraction 0 < f <= 1"),
    (True, "expected text or a number"),
    (None, "expected text or a number"),
]


@pytest.mark.parametrize(("text", "problem"), REJECTED)
def test_parse_rejects_with_the_accepted_forms(text, problem):
    with pytest.raises(InvalidOptionError) as info:
        parse_limit(text, field="--host-ram-limit")
    message = str(info.value)
    assert info.value.field == "--host-ram-limit"
    assert problem in message
    for example in ("auto", "0.5", "50%", "8GiB", "8GB", "512MiB", "plain bytes"):
        assert example in message


@pytest.mark.parametrize(("text", "hint"), [
    ("8", "did you mean 8GiB or 8GB?"),
    ("8G", "did you mean 8GiB or 8GB?"),
    ("16m", "did you mean 16MiB or 16MB?"),
    ("1.5", "e.g. 1.5GiB"),
    ("1e9", "1GB"),
])
def test_parse_hints_at_the_likely_meaning(text, hint):
    with pytest.raises(InvalidOptionError) as info:
        parse_limit(text, field="--vram-limit")
    assert info.value.hint is not None and hint in info.value.hint


def test_limit_equality_ignores_spelling():
    assert parse_limit("50%", field="x") == parse_limit("0.5", field="x")
    assert str(Limit("bytes", 3 * GIB)) == "3GiB" and str(Limit("fraction", 0.25)) == "25%"
    with pytest.raises(InvalidOptionError):
        Limit("fraction", 1.5)


# -- resolution: never invent capacity -------------------------------------------------------


def test_resolve_fraction_bytes_and_auto():
    half = Limit("fraction", 0.5)
    assert half.resolve(1000) == 500
    assert half.resolve(None) is None  # a fraction of unknown is unknown
    big = Limit("bytes", 2000)
    detail = big.resolve_detail(1000)
    assert (detail.bytes, detail.clamped) == (1000, True) and "clamped" in detail.note
    assert big.resolve_detail(5000).clamped is False
    assert big.resolve(None) == 2000  # the user's own number stands, unchecked
    assert AUTO.resolve(1000, auto=600) == 600
    assert AUTO.resolve(None) is None


def _reading(total: int | None, available: int | None, ours: int | None = 0) -> CapacityReading:
    used = None if total is None or available is None else total - available
    return CapacityReading("t", total, used, available, ours)


@pytest.mark.parametrize(("tier", "reading", "expected"), [
    # 8 GB laptop, browser open: 4 GiB available, we hold 0.5 GiB -> 75% of 4.5 GiB
    ("host_ram", _reading(8 * GIB, 4 * GIB, GIB // 2), 27 * GIB // 8),
    # idle 8 GB machine: 75% of 7 GiB
    ("host_ram", _reading(8 * GIB, 7 * GIB), 21 * GIB // 4),
    # free memory unknown: from the total, still leaving the reserve
    ("host_ram", _reading(8 * GIB, None), 6 * GIB),
    # 8 GiB GPU with 7 GiB free: 90% of it
    ("vram", _reading(8 * GIB, 7 * GIB), int(7 * GIB * 0.9)),
    # 24 GiB GPU, all free: total minus the 512 MiB reserve is lower than 90%... not here
    ("vram", _reading(24 * GIB, 24 * GIB), int(24 * GIB * 0.9)),
    # 1 GiB iGPU budget, all free: total minus 5% reserve bounds it
    ("vram", _reading(GIB, GIB), int(GIB * 0.9)),
    # disk: 25% of free, at most 8 GiB
    ("disk", _reading(500 * GIB, 100 * GIB), 8 * GIB),
    ("disk", _reading(500 * GIB, 10 * GIB), 10 * GIB // 4),
    ("vram", _reading(None, None), None),
])
def test_auto_per_tier(tier, reading, expected):
    assert auto_limit(tier, reading) == expected


def test_clamps_absolute_limits_without_fabricating_capacity():
    """Seed: an absolute limit above a known capacity is clamped to it; a fraction of an
    unknown capacity stays unknown (no provisional capacity is made up)."""
    limits = GovernorLimits(vram=Limit("bytes", 8 * GIB + 1), host_ram=Limit("fraction", 0.5),
                            disk=AUTO)
    providers = CapacityProviders(vram=FixedCapacity(8 * GIB, 0),
                                  host_ram=UnknownCapacity("RAM", "cannot measure"),
                                  disk=FixedCapacity(16 * GIB, 0))
    snap = Governor(limits, providers).snapshot()
    assert (snap.vram.limit, snap.vram.clamped) == (8 * GIB, True)
    assert "clamped to capacity 8GiB" in snap.vram.note
    assert snap.host_ram.limit is None and snap.host_ram.headroom is None
    assert "not enforced" in snap.host_ram.note and "cannot measure" in snap.host_ram.note
    assert snap.disk is not None and snap.disk.limit == 4 * GIB  # 25% of 16 GiB free

    unknown_gpu = CapacityProviders(vram=UnknownCapacity("VRAM", "no driver"),
                                    host_ram=FixedCapacity(GIB, 0))
    snap = Governor(GovernorLimits(vram=Limit("bytes", 8 * GIB)), unknown_gpu).snapshot()
    assert (snap.vram.limit, snap.vram.clamped, snap.vram.capacity) == (8 * GIB, False, None)


# -- budget --------------------------------------------------------------------------------


def test_budget_pages_and_tokens_that_fit():
    b = compute_budget("vram", 1000, weights_bytes=300, page_bytes=100, tokens_per_page=16,
                       overhead_estimate_bytes=150)
    assert (b.kv_bytes, b.kv_pages, b.kv_tokens, b.fits) == (550, 5, 80, True)
    measured = compute_budget("vram", 1000, weights_bytes=300, page_bytes=100,
                              tokens_per_page=16, overhead_estimate_bytes=150,
                              overhead_measured_bytes=50)
    assert (measured.overhead_bytes, measured.kv_pages) == (50, 6)
    unknown = compute_budget("vram", None, weights_bytes=300, page_bytes=100, tokens_per_page=16)
    assert (unknown.kv_pages, unknown.kv_tokens, unknown.refusal) == (None, None, None)


def test_budget_refuses_when_weights_do_not_fit():
    b = compute_budget("vram", 2 * GIB, weights_bytes=3 * GIB, page_bytes=MIB,
                       tokens_per_page=16, overhead_estimate_bytes=GIB // 2)
    assert b.kv_pages == 0 and not b.fits and b.refusal is not None
    assert b.refusal.startswith("the weights alone (3GiB weights + 512MiB overhead)")
    assert "VRAM limit of 2GiB" in b.refusal
    assert "raise --vram-limit to at least 3.51GiB or run the model on the CPU" in b.refusal
    tight = compute_budget("host_ram", 2 * GIB, weights_bytes=GIB, page_bytes=MIB,
                           tokens_per_page=16, overhead_estimate_bytes=GIB)
    assert tight.refusal is not None
    assert tight.refusal.startswith("the weights and runtime overhead")
    assert "--host-ram-limit" in tight.refusal and "use a smaller model" in tight.refusal
    with pytest.raises(InvalidOptionError):
        compute_budget("vram", 1000, weights_bytes=0, page_bytes=0, tokens_per_page=16)


# -- governor: seed behaviour ----------------------------------------------------------------


def _providers(disk: bool = False) -> CapacityProviders:
    return CapacityProviders(vram=FixedCapacity(1000 * MIB, 0),
                             host_ram=FixedCapacity(2000 * MIB, 0),
                             disk=FixedCapacity(4000 * MIB, 0) if disk else None)


def test_reflects_configured_limits_without_a_model():
    limits = GovernorLimits(vram=Limit("fraction", 0.5), host_ram=AUTO)
    gov = Governor(limits, _providers(), runtime_override=True, kv_tier="vram")
    snap = gov.snapshot()
    assert snap.budget is None  # no model: no page size yet
    assert (snap.vram.configured, snap.vram.limit, snap.vram.headroom) == ("50%", 500 * MIB,
                                                                           500 * MIB)
    assert (snap.host_ram.configured, snap.host_ram.used) == ("auto", 0)
    assert snap.host_ram.limit == snap.host_ram.headroom == 1500 * MIB
    assert snap.disk is None

    gov.set_kv_geometry(100 * MIB, 16)
    budget = gov.snapshot().budget
    assert budget is not None and (budget.kv_pages, budget.kv_tokens) == (5, 80)

    change = gov.set_limit("vram", "800MiB")
    assert (change.previous, change.configured, change.limit_bytes) == ("50%", "800MiB",
                                                                        800 * MIB)
    assert gov.snapshot().vram.configured == "800MiB"


def test_snapshot_reports_used_limit_and_headroom_for_each_tier():
    providers = CapacityProviders(vram=FixedCapacity(1000 * MIB, 100 * MIB),
                                  host_ram=FixedCapacity(2000 * MIB, 500 * MIB),
                                  disk=FixedCapacity(4000 * MIB, 1000 * MIB))
    limits = GovernorLimits.parse(vram="800MiB", host_ram="1200MiB", disk="3000MiB")
    gov = Governor(limits, providers)
    gov.report("vram", kv_bytes=300 * MIB)
    gov.report("host_ram", weights_bytes=500 * MIB)
    gov.report("disk", kv_bytes=1000 * MIB)
    snap = gov.snapshot()
    assert snap.disk is not None
    got = {t.tier: (t.used, t.limit, t.headroom) for t in (snap.vram, snap.host_ram, snap.disk)}
    assert got == {"vram": (300 * MIB, 800 * MIB, 500 * MIB),
                   "host_ram": (500 * MIB, 1200 * MIB, 700 * MIB),
                   "disk": (1000 * MIB, 3000 * MIB, 2000 * MIB)}
    assert snap.breakdown.kv_vram_bytes == 300 * MIB
    assert snap.breakdown.kv_disk_bytes == 1000 * MIB
    assert snap.breakdown.weights_bytes == 500 * MIB


def test_rejects_live_change_without_runtime_override():
    gov = Governor(GovernorLimits(), _providers())
    before = gov.limit("vram")
    with pytest.raises(ResourceLimitError, match="runtime override is disabled"):
        gov.set_limit("vram", "800MiB")
    assert gov.limit("vram") == before


# -- governor: room, enforcement, live changes --------------------------------------------------


def test_room_follows_measured_use_and_other_processes():
    # we measure 600 MiB although the engine reported 500: the measured number counts
    host = FixedCapacity(2000 * MIB, 900 * MIB, process_used=600 * MIB)
    gov = Governor(GovernorLimits.parse(host_ram="1200MiB"),
                   CapacityProviders(vram=UnknownCapacity("VRAM", "cpu"), host_ram=host))
    gov.report("host_ram", weights_bytes=500 * MIB)
    snap = gov.snapshot().host_ram
    assert (snap.used, snap.others_used, snap.headroom) == (600 * MIB, 300 * MIB, 600 * MIB)
    # other programs took almost everything: 1900 of 2000 MiB used, 200 MiB reserve kept
    crowded = Governor(GovernorLimits.parse(host_ram="1500MiB"), CapacityProviders(
        vram=UnknownCapacity("VRAM", "cpu"), host_ram=FixedCapacity(2000 * MIB, 1900 * MIB)))
    assert crowded.room("host_ram") == 0
    assert not crowded.can_allocate("host_ram", MIB)
    assert crowded.can_allocate("host_ram", 0)


def test_unknown_and_disabled_tiers():
    gov = Governor(GovernorLimits(), CapacityProviders(
        vram=UnknownCapacity("VRAM", "no driver"), host_ram=FixedCapacity(GIB, 0)))
    assert gov.room("vram") is None and gov.can_allocate("vram", 100 * GIB)  # not enforced
    assert gov.room("disk") == 0 and not gov.can_allocate("disk", 1)  # spill is off
    assert gov.snapshot().disk is None and gov.snapshot().tier("disk") is None
    with pytest.raises(InvalidOptionError):
        gov.can_allocate("vram", -1)
    with pytest.raises(InvalidOptionError, match="expected one of vram, host_ram, disk"):
        tier_name("gpu")
    with pytest.raises(InvalidOptionError):
        gov.report("vram", kv_bytes=-1)


def test_lowering_a_limit_reports_the_excess_and_the_outcome():
    gov = Governor(GovernorLimits.parse(vram="800MiB"), _providers(), runtime_override=True,
                   kv_tier="vram")
    gov.set_kv_geometry(10 * MIB, 16)
    gov.report("vram", weights_bytes=200 * MIB, kv_bytes=400 * MIB)
    assert gov.can_allocate("vram", 200 * MIB) and not gov.can_allocate("vram", 201 * MIB)

    change = gov.set_limit("vram", "50%")  # 500 MiB, we hold 600 MiB
    assert (change.limit_bytes, change.used_bytes, change.excess_bytes) == (
        500 * MIB, 600 * MIB, 100 * MIB)
    assert gov.over_limit("vram") == 100 * MIB and gov.room("vram") == 0
    budget = gov.budget()
    assert budget is not None and budget.kv_pages == 30  # (500 - 200) / 10

    gov.report("vram", kv_bytes=300 * MIB)  # the engine evicted 10 prefix pages
    outcome = LimitOutcome(change, bytes_freed=100 * MIB, pages_evicted=10,
                           still_over=gov.over_limit("vram") > 0)
    assert outcome.still_over is False
    assert json.loads(json.dumps(outcome.as_dict()))["change"]["excess_bytes"] == 100 * MIB

    raised = gov.set_limit("vram", Limit("bytes", 2 * GIB))  # clamped to the 1000 MiB card
    assert (raised.limit_bytes, raised.clamped, raised.excess_bytes) == (1000 * MIB, True, 0)
    squeezed = gov.set_limit("vram", "100MiB")
    assert "weights and overhead alone exceed it" in squeezed.note
    with pytest.raises(InvalidOptionError) as info:
        gov.set_limit("vram", "lots")
    assert info.value.field == "--vram-limit"


def test_no_room_message_states_the_numbers():
    gov = Governor(GovernorLimits.parse(host_ram="4GiB"), CapacityProviders(
        vram=UnknownCapacity("VRAM", "cpu"),
        host_ram=FixedCapacity(16 * GIB, 6 * GIB, process_used=3 * GIB)))
    gov.report("host_ram", weights_bytes=3 * GIB, kv_bytes=GIB // 2)
    message = gov.explain_no_room("host_ram", GIB)
    assert message.startswith("host RAM: 1GiB more is needed but 512MiB is left")
    for part in ("(limit 4GiB, this app uses 3.5GiB", "this app uses 3.5GiB",
                 "other processes use 3GiB", "10GiB free",
                 "raise --host-ram-limit to at least 4.5GiB",
                 "close sessions or use a shorter context"):
        assert part in message
    error = gov.no_room_error("host_ram", GIB)
    assert isinstance(error, ResourceLimitError) and str(error) == message
    assert "cannot hold that" in gov.explain_no_room("host_ram", 20 * GIB)
    assert explain_no_room("disk", MIB, None).startswith("disk spill is off; set --disk-limit")


def test_no_room_because_other_programs_took_the_memory():
    gov = Governor(GovernorLimits.parse(host_ram="8GiB"), CapacityProviders(
        vram=UnknownCapacity("VRAM", "cpu"), host_ram=FixedCapacity(16 * GIB, 15 * GIB)))
    message = gov.explain_no_room("host_ram", GIB)
    assert "close other programs" in message and "raise" not in message
    assert "limit 8GiB" in message and "1GiB free" in message
    half = Governor(GovernorLimits.parse(host_ram="50%"), CapacityProviders(
        vram=UnknownCapacity("VRAM", "cpu"), host_ram=FixedCapacity(16 * GIB, 0)))
    assert "limit 8GiB (set as 50%)" in half.explain_no_room("host_ram", 9 * GIB)


# -- snapshot JSON ---------------------------------------------------------------------------


def test_snapshot_json_round_trip():
    gov = Governor(GovernorLimits.parse(vram="6GiB", host_ram="50%", disk="2GiB"),
                   CapacityProviders(vram=FixedCapacity(8 * GIB, GIB, process_used=GIB // 2),
                                     host_ram=FixedCapacity(16 * GIB, 4 * GIB),
                                     disk=FixedCapacity(100 * GIB, 50 * GIB)),
                   kv_tier="vram")
    gov.set_kv_geometry(2 * MIB, 16)
    gov.report("vram", weights_bytes=2 * GIB, kv_bytes=GIB, overhead_estimate_bytes=GIB // 4)
    gov.report("host_ram", kv_bytes=GIB // 2)
    snap = gov.snapshot()
    text = json.dumps(snap.as_dict())
    assert GovernorSnapshot.from_dict(json.loads(text)) == snap
    d = json.loads(text)
    assert d["vram"]["configured"] == "6GiB" and d["host_ram"]["limit"] == 8 * GIB
    assert d["budget"]["kv_pages"] == (6 * GIB - 2 * GIB - GIB // 4) // (2 * MIB)
    assert d["breakdown"]["overhead_bytes"] == GIB // 4
    bare = Governor(GovernorLimits(), _providers()).snapshot()
    assert GovernorSnapshot.from_dict(json.loads(json.dumps(bare.as_dict()))) == bare


# -- real providers on this machine ------------------------------------------------------------


def test_governor_on_this_machines_ram_and_disk(tmp_path: Path):
    gov = Governor(GovernorLimits.parse(host_ram="50%", disk="auto"),
                   default_providers("cpu", spill_dir=tmp_path / "spill"))
    snap = gov.snapshot()
    assert snap.host_ram.capacity is not None and snap.host_ram.used > 0
    assert snap.host_ram.limit == snap.host_ram.capacity // 2
    assert snap.host_ram.headroom is not None and snap.host_ram.others_used is not None
    assert snap.vram.limit is None and snap.vram.headroom is None  # no GPU: unknown
    assert snap.disk is not None and snap.disk.limit is not None and snap.disk.limit > 0
    json.dumps(snap.as_dict())


# -- CUDA arena options -------------------------------------------------------------------------


def test_cuda_provider_options():
    assert cuda_provider_options(2 * GIB) == {
        "device_id": "0", "gpu_mem_limit": str(2 * GIB),
        "arena_extend_strategy": "kSameAsRequested"}
    opts = cuda_provider_options(2 * GIB, device_id=1, outside_arena_bytes=GIB // 2)
    assert opts["gpu_mem_limit"] == str(3 * GIB // 2) and opts["device_id"] == "1"
    assert "gpu_mem_limit" not in cuda_provider_options(None)
    with pytest.raises(ResourceLimitError, match="leaves nothing for ONNX Runtime's arena"):
        cuda_provider_options(GIB, outside_arena_bytes=GIB)


def test_format_bytes_is_readable_and_parses_back():
    assert format_bytes(3 * GIB // 2) == "1.5GiB" and format_bytes(None) == "unknown"
    assert format_bytes(512) == "512B" and format_bytes(8 * GIB) == "8GiB"
    assert format_bytes(GIB + 1, up=True) == "1.01GiB"
    assert parse_limit(format_bytes(4_831_838_208, up=True), field="x").value >= 4_831_838_208
