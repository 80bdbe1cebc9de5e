"""Memory limits: parsing, what they resolve to per tier, the KV budget they leave.

Tiers: `vram` (the GPU the model runs on), `host_ram`, `disk` (KV spill, optional).
A limit is `auto`, a fraction or percentage of the tier's capacity, or bytes; it covers
everything this app puts on the tier: weights, KV, activations and runtime overhead.

What `auto` resolves to (once, when set; the live check in `room` follows memory as it
moves). "Ours" is what this process already holds on the tier:

- host RAM: 75% of (available + ours), never more than total minus min(1 GiB, 10%). With
  8 GB and a browser open (about 4 GiB available) that is about 3 GiB: the app never
  pushes the machine into swap, and the OS and other programs keep a quarter of the rest.
- VRAM: 90% of (free + ours), never more than total minus min(512 MiB, 5%). GPU memory is
  rarely shared with much else; CUDA/cuBLAS workspaces outside ORT's arena need the rest.
- disk: 25% of (free + ours), at most 8 GiB: a cache must never be what fills a laptop disk.

Nothing is invented: a fraction (or `auto`) of an unknown capacity is unknown; bytes above
a known capacity are clamped to it and flagged; bytes over an unknown capacity stand.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from engine.errors import InvalidOptionError, ResourceLimitError
from engine.memory.capacity import CapacityReading

Tier = Literal["vram", "host_ram", "disk"]
TIERS: tuple[Tier, ...] = ("vram", "host_ram", "disk")
TIER_LABELS: dict[str, str] = {"vram": "VRAM", "host_ram": "host RAM", "disk": "disk spill"}
LIMIT_FLAGS: dict[str, str] = {"vram": "--vram-limit", "host_ram": "--host-ram-limit",
                               "disk": "--disk-limit"}
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

ACCEPTED_FORMS = ("auto; a fraction of capacity 0 < f <= 1 (0.5); a percentage (50%); "
                  "a size with a unit (8GiB, 8GB, 512MiB, 1.5GiB, 100MB, 64KiB); "
                  "or plain bytes (8589934592)")
_UNITS: dict[str, tuple[str, int]] = {
    "b": ("B", 1), "kb": ("KB", 10**3), "mb": ("MB", 10**6), "gb": ("GB", 10**9),
    "tb": ("TB", 10**12), "kib": ("KiB", KIB), "mib": ("MiB", MIB), "gib": ("GiB", GIB),
    "tib": ("TiB", 1 << 40),
}
_LIMIT_RE = re.compile(r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
                       r"(?P<unit>%|[A-Za-z]*)")
#: A unitless integer smaller than this is surely a size without its unit ("8").
MIN_PLAIN_BYTES = MIB

LimitKind = Literal["auto", "fraction", "bytes"]


def format_bytes(n: int | None, *, up: bool = False) -> str:
    """`1.5GiB`-style (parseable by `parse_limit`); `up` rounds up, for "at least" advice."""
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            x = n / size
            x = math.ceil(x * 100) / 100 if up else round(x, 2)
            return f"{x:.2f}".rstrip("0").rstrip(".") + unit
    return f"{n}B"


@dataclass(frozen=True)
class ResolvedLimit:
    """A limit in bytes for a capacity (None = unknown), and whether it was clamped."""

    bytes: int | None
    clamped: bool = False
    note: str = ""


@dataclass(frozen=True)
class Limit:
    """One configured limit: `auto`, a fraction of capacity in (0, 1], or bytes.

    `text` is the user's own spelling ("50%", "8GiB"); equality ignores it.
    """

    kind: LimitKind
    value: int | float = 0
    text: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        ok = {"auto": lambda v: v == 0, "fraction": lambda v: 0 < v <= 1,
              "bytes": lambda v: isinstance(v, int) and v >= 1}.get(self.kind)
        if ok is None or isinstance(self.value, bool) or not ok(self.value):
            raise InvalidOptionError("limit", f"bad {self.kind!r} limit value {self.value!r}",
                                     hint=f"use parse_limit; accepted: {ACCEPTED_FORMS}")

    def __str__(self) -> str:
        if self.text:
            return self.text
        if self.kind == "fraction":
            return f"{self.value * 100:g}%"
        if self.kind == "bytes":
            for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
                if self.value % size == 0:
                    return f"{int(self.value) // size}{unit}"
            return str(self.value)
        return "auto"

    def resolve(self, capacity: int | None, *, auto: int | None = None) -> int | None:
        """Bytes for a tier of `capacity` bytes (None = unknown); `auto` is the tier's
        auto value (see `auto_limit`)."""
        return self.resolve_detail(capacity, auto=auto).bytes

    def resolve_detail(self, capacity: int | None, *, auto: int | None = None) -> ResolvedLimit:
        if self.kind == "bytes":
            wanted: int | None = int(self.value)
        elif self.kind == "fraction":
            wanted = None if capacity is None else int(capacity * self.value)
        else:
            wanted = auto
        if wanted is None:
            return ResolvedLimit(None, note="capacity unknown")
        if capacity is not None and wanted > capacity:
            return ResolvedLimit(capacity, True, f"clamped to capacity {format_bytes(capacity)}")
        return ResolvedLimit(wanted, note="" if capacity is not None else "capacity unknown")


AUTO = Limit("auto")


def _bad(field: str, value: object, problem: str, hint: str = "e.g. 8GiB or 50%") -> Exception:
    return InvalidOptionError(field, f"{problem}, got {value!r}; accepted: {ACCEPTED_FORMS}",
                              hint=hint)


def _plain_bytes(n: int, text: str, field: str) -> Limit:
    if n <= 0:
        raise _bad(field, text, "a limit must be greater than zero")
    if n < MIN_PLAIN_BYTES:
        raise _bad(field, text, f"{text} would be {n} bytes",
                   hint=f"did you mean {text}GiB or {text}GB?")
    return Limit("bytes", n, text)


def parse_limit(text: str | int | float | Limit, *, field: str) -> Limit:
    """Parse a limit; `field` names it in errors (e.g. "--vram-limit")."""
    if isinstance(text, Limit):
        return text
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise _bad(field, text, "expected text or a number")
    if isinstance(text, int):
        return _plain_bytes(text, str(text), field)
    if isinstance(text, float):
        if math.isfinite(text) and 0 < text <= 1:
            return Limit("fraction", text, str(text))
        if math.isfinite(text) and text > 1 and text.is_integer():
            return _plain_bytes(int(text), str(int(text)), field)
        raise _bad(field, text, "a number must be a fraction 0 < f <= 1 or whole bytes")
    s = text.strip()
    if s.lower() == "auto":
        return Limit("auto", 0, "auto")
    m = _LIMIT_RE.fullmatch(s)
    if m is None:
        raise _bad(field, text, "not a limit")
    number, unit = m["num"], m["unit"].lower()
    if "e" in number.lower():
        raise _bad(field, text, "scientific notation is not accepted",
                   hint="write the size with a unit, e.g. 1GB for 1e9")
    value = Decimal(number)
    if value <= 0:
        raise _bad(field, text, "a limit must be greater than zero")
    if unit == "%":
        if value > 100:
            raise _bad(field, text, "a percentage must be at most 100%")
        return Limit("fraction", float(value / 100), f"{number}%")
    if unit == "" and "." in number:
        if value > 1:
            raise _bad(field, text, "a fraction must be at most 1 (100%)",
                       hint=f"for a size add a unit, e.g. {number}GiB")
        return Limit("fraction", float(value), number)
    if unit == "":
        return _plain_bytes(int(value), number, field)
    if unit not in _UNITS:
        hint = (f"did you mean {number}{unit[0].upper()}iB or {number}{unit[0].upper()}B?"
                if unit in ("k", "m", "g", "t") else "units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
        raise _bad(field, text, f"unknown unit {m['unit']!r}", hint=hint)
    name, size = _UNITS[unit]
    n = int(value * size)
    if n < 1:
        raise _bad(field, text, "less than one byte")
    return Limit("bytes", n, f"{number}{name}")


@dataclass(frozen=True)
class AutoPolicy:
    """`auto` = fraction x (free + ours), at most total - reserve, at most `cap`."""

    fraction: float
    reserve_fraction: float
    reserve_cap: int
    cap: int | None = None

    def reserve(self, total: int) -> int:
        """Bytes kept free for the OS, drivers and other programs."""
        return min(self.reserve_cap, int(total * self.reserve_fraction))


AUTO_POLICIES: dict[str, AutoPolicy] = {
    "vram": AutoPolicy(0.90, 0.05, 512 * MIB),
    "host_ram": AutoPolicy(0.75, 0.10, GIB),
    "disk": AutoPolicy(0.25, 0.05, 2 * GIB, cap=8 * GIB),
}


def auto_limit(tier: str, reading: CapacityReading) -> int | None:
    """What `auto` means for `tier` on this reading (None when the total is unknown;
    with free memory unknown it works from the total)."""
    if reading.total is None:
        return None
    policy = AUTO_POLICIES[tier]
    pool = reading.total if reading.available is None else (
        reading.available + (reading.process_used or 0))
    limit = min(int(pool * policy.fraction), reading.total - policy.reserve(reading.total))
    return max(0, limit if policy.cap is None else min(limit, policy.cap))


@dataclass(frozen=True)
class Budget:
    """What a tier's limit leaves for KV once weights and overhead are placed.

    Overhead is the measured number after warm-up when there is one, else the estimate.
    `kv_pages`/`kv_tokens` are None when the limit is unknown; `refusal` says why the
    model cannot be placed on this tier (weights or overhead leave no KV page).
    """

    tier: str
    limit_bytes: int | None
    weights_bytes: int
    overhead_estimate_bytes: int
    overhead_measured_bytes: int | None
    page_bytes: int
    tokens_per_page: int
    kv_bytes: int | None
    kv_pages: int | None
    kv_tokens: int | None
    refusal: str | None = None

    @property
    def overhead_bytes(self) -> int:
        measured = self.overhead_measured_bytes
        return self.overhead_estimate_bytes if measured is None else measured

    @property
    def fits(self) -> bool:
        return self.refusal is None


def compute_budget(tier: str, limit_bytes: int | None, *, weights_bytes: int, page_bytes: int,
                   tokens_per_page: int, overhead_estimate_bytes: int = 0,
                   overhead_measured_bytes: int | None = None) -> Budget:
    """Pages and tokens of KV that fit under `limit_bytes` beside weights and overhead."""
    for name, v, least in (("weights_bytes", weights_bytes, 0), ("page_bytes", page_bytes, 1),
                           ("tokens_per_page", tokens_per_page, 1),
                           ("overhead_estimate_bytes", overhead_estimate_bytes, 0),
                           ("overhead_measured_bytes", overhead_measured_bytes or 0, 0)):
        if v < least:
            raise InvalidOptionError(name, f"expected an integer >= {least}, got {v}")
    overhead = (overhead_estimate_bytes if overhead_measured_bytes is None
                else overhead_measured_bytes)
    kv = pages = refusal = None
    if limit_bytes is not None:
        kv = max(0, limit_bytes - weights_bytes - overhead)
        pages = kv // page_bytes
        if pages == 0:
            refusal = _no_page_reason(tier, limit_bytes, weights_bytes, overhead, page_bytes)
    return Budget(tier, limit_bytes, weights_bytes, overhead_estimate_bytes,
                  overhead_measured_bytes, page_bytes, tokens_per_page, kv, pages,
                  None if pages is None else pages * tokens_per_page, refusal)


def _no_page_reason(tier: str, limit: int, weights: int, overhead: int, page: int) -> str:
    label, flag = TIER_LABELS.get(tier, tier), LIMIT_FLAGS.get(tier, "the limit")
    what = "the weights alone" if weights > limit else "the weights and runtime overhead"
    other = "run the model on the CPU" if tier == "vram" else "use a smaller model"
    return (f"{what} ({format_bytes(weights)} weights + {format_bytes(overhead)} overhead) "
            f"leave no room for one KV page ({format_bytes(page)}) under the {label} limit of "
            f"{format_bytes(limit)}; raise {flag} to at least "
            f"{format_bytes(weights + overhead + page, up=True)} or {other}")


def cuda_provider_options(vram_limit_bytes: int | None, *, device_id: int = 0,
                          outside_arena_bytes: int = 0) -> dict[str, str]:
    """ONNX Runtime CUDA EP options that cap the arena at the VRAM limit.

    `outside_arena_bytes` is what CUDA uses beside the arena (context, cuBLAS workspace);
    the arena gets the rest. It grows by what is asked (`kSameAsRequested`), not by
    doubling, so it never overshoots the cap by a power of two.
    """
    options = {"device_id": str(device_id), "arena_extend_strategy": "kSameAsRequested"}
    if vram_limit_bytes is not None:
        arena = vram_limit_bytes - outside_arena_bytes
        if arena <= 0:
            raise ResourceLimitError(
                f"the VRAM limit {format_bytes(vram_limit_bytes)} leaves nothing for ONNX "
                f"Runtime's arena once {format_bytes(outside_arena_bytes)} of CUDA overhead "
                f"is set aside", hint=f"raise --vram-limit above "
                f"{format_bytes(outside_arena_bytes, up=True)} or run on the CPU")
        options["gpu_mem_limit"] = str(arena)
    return options


def tier_name(tier: str) -> Tier:
    """Validate a tier name at the public edge."""
    if tier not in TIERS:
        raise InvalidOptionError("tier", f"expected one of {', '.join(TIERS)}, got {tier!r}")
    return tier

