"""What the memory governor reports: a tier's snapshot (limit, use, capacity, headroom,
and what the use is made of), the whole snapshot, the outcome of a live limit change,
and why a request does not fit, in numbers, with what to change (`explain_no_room`).
The server and the app read these; the `Governor` (engine/memory/governor.py) fills
them in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

from engine.memory.limits import LIMIT_FLAGS, TIER_LABELS, Budget, format_bytes, tier_name


@dataclass(frozen=True)
class TierSnapshot:
    """One tier. `used` is this app: the larger of what the engine reported (weights + KV
    + overhead) and what the provider measured for this process. `headroom` is what the
    next allocation can get: limit - used, or less when the system has less free (beyond
    the tier's reserve). None = unknown; an unknown headroom is not enforced."""

    tier: str
    configured: str
    limit: int | None
    clamped: bool
    capacity: int | None
    available: int | None
    used: int
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    process_used: int | None
    others_used: int | None
    headroom: int | None
    note: str = ""


@dataclass(frozen=True)
class Breakdown:
    """Bytes the engine reported, summed over tiers (KV per tier)."""

    weights_bytes: int
    kv_vram_bytes: int
    kv_host_ram_bytes: int
    kv_disk_bytes: int
    overhead_bytes: int


@dataclass(frozen=True)
class GovernorSnapshot:
    """Everything the gauges show; `budget` is the KV tier's (None before a model)."""

    runtime_override: bool
    kv_tier: str
    vram: TierSnapshot
    host_ram: TierSnapshot
    disk: TierSnapshot | None
    budget: Budget | None
    breakdown: Breakdown

    def tier(self, name: str) -> TierSnapshot | None:
        return cast("TierSnapshot | None", getattr(self, tier_name(name)))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GovernorSnapshot:
        return cls(d["runtime_override"], d["kv_tier"], TierSnapshot(**d["vram"]),
                   TierSnapshot(**d["host_ram"]),
                   None if d["disk"] is None else TierSnapshot(**d["disk"]),
                   None if d["budget"] is None else Budget(**d["budget"]),
                   Breakdown(**d["breakdown"]))


@dataclass(frozen=True)
class LimitChange:
    """A live limit change; the engine must free `excess_bytes` of what it reported."""

    tier: str
    previous: str
    configured: str
    limit_bytes: int | None
    clamped: bool
    used_bytes: int
    excess_bytes: int
    note: str = ""


@dataclass(frozen=True)
class LimitOutcome:
    """What the engine did to honour a `LimitChange` (prefix-cache pages evicted, idle
    sessions spilled, lower-priority requests preempted) and whether it is still over."""

    change: LimitChange
    bytes_freed: int = 0
    pages_evicted: int = 0
    sessions_spilled: int = 0
    requests_preempted: int = 0
    still_over: bool = False
    #: When still over: by how much, and why (in numbers); empty otherwise.
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def explain_no_room(tier: str, needed: int, snap: TierSnapshot | None) -> str:
    """Why `needed` more bytes do not fit on `tier`, in numbers, and what to change.
    `snap` is the tier's snapshot, None when the tier is off."""
    label, flag = TIER_LABELS[tier_name(tier)], LIMIT_FLAGS[tier]
    if snap is None:
        return f"{label} is off; set {flag} (e.g. {flag} 4GiB) to use it"
    limit = format_bytes(snap.limit)
    set_as = "" if snap.configured == limit else f" (set as {snap.configured})"
    facts = [f"limit {limit}{set_as}", f"this app uses {format_bytes(snap.used)}"]
    if snap.others_used is not None:
        facts.append(f"other processes use {format_bytes(snap.others_used)}")
    if snap.available is not None:
        facts.append(f"{format_bytes(snap.available)} free")
    fixes = []
    if snap.limit is not None and snap.limit - snap.used < needed:
        target = snap.used + needed
        if snap.capacity is not None and target > snap.capacity:
            fixes.append(f"this machine's {label} ({format_bytes(snap.capacity)}) cannot hold "
                         "that; use a smaller model")
        else:
            fixes.append(f"raise {flag} to at least {format_bytes(target, up=True)}")
    else:
        fixes.append("close other programs")
    fixes.append("close sessions or use a shorter context")
    return (f"{label}: {format_bytes(needed)} more is needed but "
            f"{format_bytes(snap.headroom)} is left ({', '.join(facts)}); "
            + " or ".join(fixes))
