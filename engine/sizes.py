"""Sizes as people write them: "8GiB", "50%", "auto", plain bytes; parsed into a `Limit`
and printed back (`format_bytes`). The bottom of the engine: options (`engine.config`)
check a limit's spelling here, and the memory package (`engine.memory.limits`) resolves
it against a tier's capacity.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from engine.errors import InvalidOptionError

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
