"""Reuse by shifting: cached runs of a prompt found at other positions, keys re-rotated.

When a new prompt holds long runs of a sequence whose KV is cached, but at other positions
(a chat's oldest exchange left out, an early message edited, an editor's window moved over
a file larger than the context), their KV is reused instead of recomputed: values as they
are, keys rotated by the position difference (engine.model.rotary). The new KV is the kept
common prefix, then in prompt order the shifted runs and the gaps between them, computed
on the spot; the rest of the prompt is prefilled as usual.

What it may change: a shifted run's KV was computed after other tokens (the ones left out,
or the text before an edit), so its keys and values still carry that context where a full
recompute would see the new one. Answers are then close to, not the same as, a recompute's
(docs/kv-and-scheduling.md has the measured agreement). `EngineConfig.cache_reuse` = 0
turns it off; runs shorter than it (or than an eighth of a shorter
prompt, at least 64 tokens) are recomputed.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.kv.quant import rows_shifted, value_dim
from engine.model.io_spec import IOSpec
from engine.model.model_dir import ModelDir
from engine.model.rotary import KeyRotation, RotaryFinding, key_rotation
from engine.runtime.runner import DecodeRunner

#: Tokens of a run's first n-gram looked up in the cached sequence's index.
ANCHOR = 16
#: Candidate places of one n-gram tried, earliest first (repetitive text has many).
TRIES = 8
#: Runs as long as 1/RELATIVE_RUN of a prompt are reused where that is under `min_run`.
RELATIVE_RUN = 8
#: ... but never under this many tokens.
SHORTEST_RUN = 64


@dataclass(frozen=True)
class Segment:
    """Prompt positions `[at, at + length)`: KV from source positions `src..` (a run), or
    computed here (`src` None: a gap between runs)."""

    at: int
    length: int
    src: int | None

    @property
    def end(self) -> int:
        return self.at + self.length


def _match_len(a: Sequence[int], i: int, b: Sequence[int], j: int, limit: int) -> int:
    """How many ids `a[i:]` and `b[j:]` share, at most `limit`; blocks compared in C."""
    n, block = 0, 64
    while n < limit:
        step = min(block, limit - n)
        if list(a[i + n:i + n + step]) == list(b[j + n:j + n + step]):
            n += step
            continue
        while n < limit and a[i + n] == b[j + n]:
            n += 1
        return n
    return n


def match_runs(cached: Sequence[int], prompt: Sequence[int], *, prefix: int, limit: int,
               min_run: int) -> list[Segment]:
    """The segments of `prompt[:limit]` after its common `prefix` with `cached`: runs of at
    least `min_run` tokens found in `cached`, in order (a later run never comes from before
    an earlier one), and the gaps between them. Nothing after the last run."""
    if limit - prefix < min_run:
        return []  # no room for a run after the prefix
    k = max(1, min(ANCHOR, min_run))
    index: dict[tuple[int, ...], list[int]] = {}
    for s in range(prefix, len(cached) - k + 1):
        index.setdefault(tuple(cached[s:s + k]), []).append(s)
    segments: list[Segment] = []
    p, c, gap = prefix, prefix, prefix
    while p + min_run <= limit:
        places = index.get(tuple(prompt[p:p + k]))
        best, where = 0, -1
        if places:
            first = bisect.bisect_left(places, c)
            for s in places[first:first + TRIES]:
                n = _match_len(cached, s, prompt, p, min(len(cached) - s, limit - p))
                if n > best:
                    best, where = n, s
        if best < min_run:
            p += 1
            continue
        if p > gap:
            segments.append(Segment(gap, p - gap, None))
        segments.append(Segment(p, best, where))
        p = gap = p + best
        c = where + best
    return segments


def probe_hits(cached: Sequence[int], prompt: Sequence[int], probes: int = 3) -> int:
    """How many of `probes` spans of `prompt` (ANCHOR tokens at its quarters) occur in
    `cached`: a cheap sign that a runner holds runs of the prompt at other positions."""
    if len(prompt) < 2 * ANCHOR or not cached:
        return 0
    hay = np.asarray(cached, dtype=np.int64).tobytes()
    hits = 0
    for k in range(1, probes + 1):
        at = len(prompt) * k // (probes + 1)
        needle = np.asarray(prompt[at:at + ANCHOR], dtype=np.int64).tobytes()
        found = hay.find(needle)
        while found >= 0 and found % 8:  # a match across two ids' bytes is not one
            found = hay.find(needle, found + 1)
        hits += found >= 0
    return hits


@dataclass
class ShiftPlan:
    """Runs chosen for a prompt, their KV already copied and moved to the new positions."""

    segments: list[Segment]
    rows: dict[int, list[np.ndarray]]  # segment index -> per-pair rows, keys rotated
    #: Fewer reused tokens than this are not worth it (`EngineConfig.cache_reuse`).
    min_run: int

    def reused_after(self, held: int) -> int:
        """Tokens past `held` whose KV the plan brings without computing it."""
        return sum(max(0, s.end - max(s.at, held)) for s in self.segments if s.src is not None)

    def apply(self, runner: DecodeRunner, prompt: list[int], chunk: int) -> int:
        """Extend `runner` (holding `prompt[:runner.length]`) segment by segment; return
        the tokens computed for gaps."""
        computed = 0
        for i, seg in enumerate(self.segments):
            lo = max(seg.at, runner.length)
            if seg.end <= lo:
                continue
            if seg.src is None:
                for start in range(lo, seg.end, chunk):
                    stop = min(start + chunk, seg.end)
                    runner.forward(np.array(prompt[start:stop], dtype=np.int64))
                    computed += stop - start
            else:
                off = lo - seg.at
                rows = [r[:, off:] for r in self.rows[i]]
                runner.import_kv(rows, lo, prompt[lo:seg.end])
        return computed


RowReader = Callable[[int, int], list[np.ndarray]]


class Shifter:
    """Finds shifted runs and moves their KV, for one model's key rotation."""

    def __init__(self, rotation: KeyRotation, spec: IOSpec, min_run: int) -> None:
        self.rotation = rotation
        self.min_run = min_run
        self._is_key = [p.kind == "key" for p in spec.kv_pairs]

    def min_run_for(self, prompt_len: int) -> int:
        """The shortest run reused in a prompt of `prompt_len` tokens: `min_run`, or an
        eighth of a shorter prompt, at least SHORTEST_RUN (an editor's 512-token window
        holds no run of 256)."""
        return min(self.min_run, max(SHORTEST_RUN, prompt_len // RELATIVE_RUN))

    def plan(self, cached: Sequence[int], prompt: list[int],
             limit: int) -> tuple[int, list[Segment]]:
        """(tokens the plan reuses, its segments) for one source holding `cached`."""
        prefix = _match_len(cached, 0, prompt, 0, min(len(cached), limit))
        runs = match_runs(cached, prompt, prefix=prefix, limit=limit,
                          min_run=self.min_run_for(len(prompt)))
        segments = ([Segment(0, prefix, 0)] if prefix else []) + runs
        return sum(s.length for s in segments if s.src is not None), segments

    def copy(self, segments: list[Segment], read: RowReader,
             min_run: int | None = None) -> ShiftPlan:
        """Copy each run's KV from its source, keys rotated to the run's new place."""
        rows: dict[int, list[np.ndarray]] = {}
        for i, seg in enumerate(segments):
            if seg.src is None:
                continue
            got = read(seg.src, seg.src + seg.length)
            src = seg.src
            rows[i] = [rows_shifted(r, functools.partial(self.rotation.shift, src=src,
                                                         dst=seg.at))
                       if key and src != seg.at else r
                       for r, key in zip(got, self._is_key, strict=True)]
        return ShiftPlan(segments, rows, self.min_run if min_run is None else min_run)


def make_shifter(model: ModelDir, spec: IOSpec, context: int,
                 min_run: int) -> tuple[Shifter | None, RotaryFinding]:
    """A shifter for the model (None when shifting is off or cannot be derived)."""
    if min_run <= 0:
        return None, RotaryFinding(None, "off (cache_reuse is 0)")
    if not spec.kv_pairs:
        return None, RotaryFinding(None, "the graph keeps no KV")
    key_dims = [value_dim(p.head_dim, p.dtype) for p in spec.kv_pairs if p.kind == "key"]
    if not key_dims or len(key_dims) == len(spec.kv_pairs):
        return None, RotaryFinding(None, "the graph's KV inputs do not tell keys from values")
    head_dim = min(key_dims)
    found = key_rotation(model.model_file, model.path / "config.json", context, head_dim)
    if found.rotation is None:
        return None, found
    if found.rotation.rotary_dim > head_dim:
        return None, RotaryFinding(None, f"rotary dim {found.rotation.rotary_dim} exceeds "
                                         f"the key head dim {head_dim}")
    return Shifter(found.rotation, spec, min_run), found
