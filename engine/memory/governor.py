"""Resource Governor: limits per tier, what the engine holds, room for KV, live changes.

The limits themselves (parsing, `auto`, clamping, the KV budget, CUDA arena options) are in
`engine.limits` and re-exported here. See that module for what `auto` means per tier.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.errors import InvalidOptionError, ResourceLimitError
from engine.memory.capacity import (
    CapacityProvider,
    CapacityProviders,
    CapacityReading,
    UnknownCapacity,
    default_providers,
    read_capacity,
)
from engine.memory.limits import (
    ACCEPTED_FORMS,
    AUTO,
    AUTO_POLICIES,
    LIMIT_FLAGS,
    TIER_LABELS,
    TIERS,
    AutoPolicy,
    Budget,
    Limit,
    ResolvedLimit,
    Tier,
    auto_limit,
    compute_budget,
    cuda_provider_options,
    format_bytes,
    parse_limit,
    tier_name,
)
from engine.memory.report import Breakdown as Breakdown
from engine.memory.report import GovernorSnapshot as GovernorSnapshot
from engine.memory.report import LimitChange as LimitChange
from engine.memory.report import LimitOutcome as LimitOutcome
from engine.memory.report import TierSnapshot as TierSnapshot
from engine.memory.report import explain_no_room as explain_no_room

__all__ = [
    "ACCEPTED_FORMS", "AUTO", "AUTO_POLICIES", "LIMIT_FLAGS", "TIERS", "TIER_LABELS",
    "AutoPolicy", "Breakdown", "Budget", "Governor", "GovernorLimits", "GovernorSnapshot",
    "Limit", "LimitChange", "LimitOutcome", "ResolvedLimit", "Tier", "TierSnapshot",
    "auto_limit", "compute_budget", "cuda_provider_options", "explain_no_room",
    "format_bytes", "governor_for", "make_governor", "parse_limit", "tier_name",
]

@dataclass(frozen=True)
class GovernorLimits:
    """Configured limits; `disk` None = no disk spill."""

    vram: Limit = AUTO
    host_ram: Limit = AUTO
    disk: Limit | None = None

    @classmethod
    def parse(cls, *, vram: str | int | float = "auto", host_ram: str | int | float = "auto",
              disk: str | int | float | None = None) -> GovernorLimits:
        return cls(parse_limit(vram, field=LIMIT_FLAGS["vram"]),
                   parse_limit(host_ram, field=LIMIT_FLAGS["host_ram"]),
                   None if disk is None else parse_limit(disk, field=LIMIT_FLAGS["disk"]))


@dataclass
class _Usage:
    weights: int = 0
    kv: int = 0
    overhead_estimate: int = 0
    overhead_measured: int | None = None

    @property
    def overhead(self) -> int:
        return self.overhead_estimate if self.overhead_measured is None else self.overhead_measured

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.overhead


class Governor:
    """Limits per tier, what the engine reported it holds, and room for KV.

    The engine reports absolute usage with `report`; the KV allocator asks `room` /
    `can_allocate` ("no room" is False, not an exception). Thread-safe: the server may
    read `snapshot` while the engine thread reports. Typical use:

        gov = Governor(GovernorLimits.parse(vram="2GiB", host_ram="50%"),
                       default_providers("cuda", spill_dir=d), kv_tier="vram")
        gov.set_kv_geometry(page_bytes, tokens_per_page)
        gov.report("vram", weights_bytes=w, overhead_estimate_bytes=e)
        budget = gov.budget()          # .refusal -> place on the CPU or refuse
        if not gov.can_allocate("vram", page_bytes): ...evict, spill, preempt, wait...
        raise gov.no_room_error("vram", page_bytes)
    """

    def __init__(self, limits: GovernorLimits, providers: CapacityProviders, *,
                 runtime_override: bool = False, kv_tier: str = "host_ram") -> None:
        self._lock = threading.RLock()
        self.runtime_override = runtime_override
        self.kv_tier = tier_name(kv_tier)
        self._providers: dict[str, CapacityProvider] = {}
        self._limits: dict[str, Limit | None] = {
            "vram": limits.vram, "host_ram": limits.host_ram, "disk": limits.disk}
        self._resolved: dict[str, ResolvedLimit] = {}
        self._usage: dict[str, _Usage] = {t: _Usage() for t in TIERS}
        self._pages: tuple[int, int] | None = None
        self.use_providers(providers)

    def use_providers(self, providers: CapacityProviders) -> None:
        """Measure capacity with `providers` from now on and resolve the limits again.

        Tests give `FixedCapacity` numbers without `process_used`, so room is exactly
        limit - (weights + KV + overhead the engine reported) and the KV budget binds.
        """
        with self._lock:
            self._providers = {
                "vram": providers.vram, "host_ram": providers.host_ram,
                "disk": providers.disk or UnknownCapacity("disk", "no spill directory")}
            for t in TIERS:
                self._resolve(t)

    def _resolve(self, tier: str) -> None:
        limit = self._limits[tier]
        if limit is None:
            self._resolved[tier] = ResolvedLimit(0, note="off")
            return
        reading = self.reading(tier)
        self._resolved[tier] = limit.resolve_detail(reading.total,
                                                    auto=auto_limit(tier, reading))

    def reading(self, tier: str) -> CapacityReading:
        return read_capacity(self._providers[tier_name(tier)])

    def enabled(self, tier: str) -> bool:
        return self._limits[tier_name(tier)] is not None

    def limit(self, tier: str) -> int | None:
        """The resolved limit in bytes (None = unknown, 0 = tier off)."""
        return self._resolved[tier_name(tier)].bytes

    def set_kv_geometry(self, page_bytes: int, tokens_per_page: int, *,
                        tier: str | None = None) -> None:
        """The model's KV page size; `tier` is where its KV pages live."""
        if page_bytes < 1 or tokens_per_page < 1:
            raise InvalidOptionError("page_bytes", f"page_bytes={page_bytes} and "
                                     f"tokens_per_page={tokens_per_page} must be >= 1")
        with self._lock:
            self._pages = (page_bytes, tokens_per_page)
            self.kv_tier = tier_name(tier) if tier is not None else self.kv_tier

    def report(self, tier: str, *, weights_bytes: int | None = None, kv_bytes: int | None = None,
               overhead_estimate_bytes: int | None = None,
               overhead_measured_bytes: int | None = None) -> None:
        """What the engine holds on `tier` now (absolute bytes; None leaves a field)."""
        given = {"weights": weights_bytes, "kv": kv_bytes,
                 "overhead_estimate": overhead_estimate_bytes,
                 "overhead_measured": overhead_measured_bytes}
        with self._lock:
            usage = self._usage[tier_name(tier)]
            for name, value in given.items():
                if value is not None:
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        raise InvalidOptionError(f"{name}_bytes", f"expected bytes >= 0, "
                                                 f"got {value!r}")
                    setattr(usage, name, value)

    def _room(self, tier: str, reading: CapacityReading) -> int | None:
        bounds = []
        limit = self._resolved[tier].bytes
        if limit is not None:
            bounds.append(limit - max(self._usage[tier].total, reading.process_used or 0))
        if reading.available is not None and reading.total is not None:
            bounds.append(reading.available - AUTO_POLICIES[tier].reserve(reading.total))
        return max(0, min(bounds)) if bounds else None

    def room(self, tier: str) -> int | None:
        """Bytes the next allocation on `tier` can take (None = unknown: not enforced)."""
        if not self.enabled(tier):
            return 0
        reading = self.reading(tier)
        with self._lock:
            return self._room(tier, reading)

    def can_allocate(self, tier: str, nbytes: int) -> bool:
        if nbytes < 0:
            raise InvalidOptionError("nbytes", f"expected bytes >= 0, got {nbytes}")
        room = self.room(tier)
        return room is None or nbytes <= room

    def over_limit(self, tier: str) -> int:
        """Reported bytes above the limit (what eviction must still free), 0 within it."""
        with self._lock:
            limit = self._resolved[tier_name(tier)].bytes
            return 0 if limit is None else max(0, self._usage[tier].total - limit)

    def budget(self, tier: str | None = None) -> Budget | None:
        """KV pages and tokens that fit on `tier` (default: the KV tier); None before
        `set_kv_geometry`."""
        with self._lock:
            name = tier_name(tier) if tier is not None else self.kv_tier
            if self._pages is None:
                return None
            u = self._usage[name]
            return compute_budget(name, self._resolved[name].bytes, weights_bytes=u.weights,
                                  page_bytes=self._pages[0], tokens_per_page=self._pages[1],
                                  overhead_estimate_bytes=u.overhead_estimate,
                                  overhead_measured_bytes=u.overhead_measured)

    def tier_snapshot(self, tier: str) -> TierSnapshot | None:
        """None when the tier is off."""
        name = tier_name(tier)
        limit = self._limits[name]
        if limit is None:
            return None
        reading = self.reading(name)
        with self._lock:
            usage, resolved = self._usage[name], self._resolved[name]
            headroom = self._room(name, reading)
            notes = [n for n in (resolved.note, reading.note) if n]
            if headroom is None:
                notes.append(f"not enforced: set {LIMIT_FLAGS[name]} to a size")
            return TierSnapshot(
                name, str(limit), resolved.bytes, resolved.clamped, reading.total,
                reading.available, max(usage.total, reading.process_used or 0), usage.weights,
                usage.kv, usage.overhead, reading.process_used, reading.others_used, headroom,
                "; ".join(dict.fromkeys(notes)))

    def snapshot(self) -> GovernorSnapshot:
        vram, host, disk = (self.tier_snapshot(t) for t in TIERS)
        assert vram is not None and host is not None
        with self._lock:
            u = self._usage
            breakdown = Breakdown(sum(x.weights for x in u.values()), u["vram"].kv,
                                  u["host_ram"].kv, u["disk"].kv,
                                  sum(x.overhead for x in u.values()))
            return GovernorSnapshot(self.runtime_override, self.kv_tier, vram, host, disk,
                                    self.budget(), breakdown)

    def set_limit(self, tier: str, value: str | int | float | Limit) -> LimitChange:
        """Change a limit while running (runtime override only). Lowering it below what
        the engine holds leaves `excess_bytes` for the engine to free, in order: prefix
        cache pages, idle sessions to host then disk, lower-priority requests."""
        name = tier_name(tier)
        if not self.runtime_override:
            raise ResourceLimitError(
                f"the {TIER_LABELS[name]} limit cannot change while running: runtime "
                "override is disabled", hint="enable runtime override in the engine "
                "configuration, or restart with the new limit")
        limit = parse_limit(value, field=LIMIT_FLAGS[name])
        with self._lock:
            previous = self._limits[name]
            self._limits[name] = limit
            self._resolve(name)
            resolved, usage = self._resolved[name], self._usage[name]
            excess = 0 if resolved.bytes is None else max(0, usage.total - resolved.bytes)
            note = resolved.note
            if resolved.bytes is not None and usage.weights + usage.overhead > resolved.bytes:
                note = "; ".join(filter(None, [note, "weights and overhead alone exceed it"]))
            return LimitChange(name, "off" if previous is None else str(previous), str(limit),
                               resolved.bytes, resolved.clamped, usage.total, excess, note)

    def explain_no_room(self, tier: str, needed: int) -> str:
        return explain_no_room(tier, needed, self.tier_snapshot(tier))

    def no_room_error(self, tier: str, needed: int) -> ResourceLimitError:
        """The refusal the user sees when waiting, evicting and preempting did not help."""
        return ResourceLimitError(self.explain_no_room(tier, needed))


def governor_for(config: EngineConfig, provider: str, page_bytes: int,
                 weights_bytes: int) -> Governor:
    """The governor an engine on ``provider`` would have: its limits from ``config``, the
    model's weights reported. Its ``budget()`` is what a load is judged by (the catalog's
    fit labels ask the same question before a download)."""
    gpu = provider in ("cuda", "directml")
    spill = config.kv_store.disk_dir if config.kv_store else None
    governor = Governor(
        GovernorLimits.parse(vram=config.vram_limit, host_ram=config.host_ram_limit,
                             disk=config.disk_limit),
        default_providers(provider, spill_dir=spill),
        runtime_override=config.runtime_override, kv_tier="vram" if gpu else "host_ram")
    governor.set_kv_geometry(page_bytes, config.kv_page_size)
    governor.report(governor.kv_tier, weights_bytes=weights_bytes)
    return governor


def make_governor(config: EngineConfig, provider: str, page_bytes: int,
                  weights_bytes: int) -> Governor:
    """The governor of an engine on ``provider`` (:func:`governor_for`), refused at once
    when the weights alone do not fit."""
    governor = governor_for(config, provider, page_bytes, weights_bytes)
    budget = governor.budget()
    if budget is not None and budget.refusal:
        raise ResourceLimitError(budget.refusal, hint="raise the memory limit or use a "
                                 "smaller (e.g. int4) model")
    return governor
