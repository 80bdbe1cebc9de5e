"""Prometheus text exposition of what the worker did and holds: requests, tokens,
latencies, memory per tier, prefix-cache and session figures.

Only what is measured is exported: prompt tokens served from reused KV come from each
result's ``prefix_cache_hit_len``; KV and memory bytes per tier are the Resource
Governor's figures (what the engine last reported; ``/v1/resources`` has the full
snapshot), read without waiting for the engine thread. Prefix-cache lookups and hits
count since the model was loaded (a reload resets them, as Prometheus expects of
counters).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.engine import Engine
from engine.memory.limits import TIERS
from engine.server.generation import Final
from engine.server.worker import JobRecord

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0)

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: Labels) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            le = 'le="' + str(bound) + '"'
            out.append(f"{name}_bucket{_labels(labels, le)} {running}")
        inf = 'le="+Inf"'
        out.append(f"{name}_bucket{_labels(labels, inf)} {self.n}")
        out.append(f"{name}_sum{_labels(labels)} {_num(self.total)}")
        out.append(f"{name}_count{_labels(labels)} {self.n}")
        return out


@dataclass(frozen=True)
class EngineGauges:
    """The served engine's memory and cache figures, read cheaply from any thread."""

    kv_bytes: dict[str, int]
    used_bytes: dict[str, int]
    limit_bytes: dict[str, int]
    prefix_cache_pages: int
    prefix_cache_lookups: int
    prefix_cache_hits: int
    sessions: int
    named_sessions: int
    store_bytes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, engine: Engine, named_sessions: int) -> EngineGauges:
        """Governor figures as last reported (thread-safe) and plain counters."""
        snap = engine.governor.snapshot()
        b = snap.breakdown
        kv = {"vram": b.kv_vram_bytes, "host_ram": b.kv_host_ram_bytes, "disk": b.kv_disk_bytes}
        tiers = [t for t in (snap.tier(name) for name in TIERS) if t is not None]
        cache = engine.prefix_cache
        store: dict[str, int] = {}
        if engine.kv_tiers is not None:
            stats = engine.kv_tiers.store.stats()
            store = {"ram": stats["ram_bytes"], "disk": stats["disk_bytes"]}
        return cls(kv, {t.tier: t.used for t in tiers},
                   {t.tier: t.limit for t in tiers if t.limit is not None},
                   len(cache) if cache is not None else 0,
                   cache.lookups if cache is not None else 0,
                   cache.hits if cache is not None else 0,
                   len(engine.sessions), named_sessions, store)

    def lines(self) -> list[str]:
        def per_tier(name: str, values: dict[str, int], label: str = "tier") -> list[str]:
            return [f'{name}{{{label}="{k}"}} {v}' for k, v in values.items()]

        return [
            "# HELP engine_kv_bytes KV cache bytes held per memory tier (the governor's "
            "figures).",
            "# TYPE engine_kv_bytes gauge", *per_tier("engine_kv_bytes", self.kv_bytes),
            "# HELP engine_memory_used_bytes Bytes this app uses per tier (weights, KV, "
            "overhead).",
            "# TYPE engine_memory_used_bytes gauge",
            *per_tier("engine_memory_used_bytes", self.used_bytes),
            "# HELP engine_memory_limit_bytes The resolved memory limit per tier (tiers "
            "whose limit is unknown are left out).",
            "# TYPE engine_memory_limit_bytes gauge",
            *per_tier("engine_memory_limit_bytes", self.limit_bytes),
            "# HELP engine_prefix_cache_pages KV pages the prefix cache indexes.",
            "# TYPE engine_prefix_cache_pages gauge",
            f"engine_prefix_cache_pages {self.prefix_cache_pages}",
            "# HELP engine_prefix_cache_lookups_total Prefix-cache lookups since the model "
            "loaded.",
            "# TYPE engine_prefix_cache_lookups_total counter",
            f"engine_prefix_cache_lookups_total {self.prefix_cache_lookups}",
            "# HELP engine_prefix_cache_hits_total Lookups that found cached pages.",
            "# TYPE engine_prefix_cache_hits_total counter",
            f"engine_prefix_cache_hits_total {self.prefix_cache_hits}",
            "# HELP engine_sessions Open engine sessions (named: X-Session-Id chats).",
            "# TYPE engine_sessions gauge",
            f'engine_sessions{{kind="all"}} {self.sessions}',
            f'engine_sessions{{kind="named"}} {self.named_sessions}',
            "# HELP engine_kv_store_bytes Bytes of the tiered KV store, per tier.",
            "# TYPE engine_kv_store_bytes gauge",
            *per_tier("engine_kv_store_bytes", self.store_bytes),
        ]


class Metrics:
    """Thread-safe counters and histograms (the engine thread reports finished jobs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[Labels, int] = defaultdict(int)
        self._latency: dict[Labels, _Histogram] = {}
        self._ttft = _Histogram(_TTFT_BUCKETS)
        self._generations: dict[Labels, int] = defaultdict(int)
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._completion_tokens = 0
        self._steps_after_cancel = 0
        self._jobs = 0
        self._last: dict[str, Any] | None = None  # the last answer's speed

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        labels = (("route", route), ("method", method), ("status", str(status)))
        with self._lock:
            self._requests[labels] += 1
            hist = self._latency.get(labels[:2])
            if hist is None:
                hist = self._latency[labels[:2]] = _Histogram(_LATENCY_BUCKETS)
            hist.observe(seconds)

    def observe_generation(self, final: Final) -> None:
        result = final.result
        with self._lock:
            self._generations[(("stop", final.stop),)] += 1
            self._prompt_tokens += result.prompt_tokens
            self._cached_tokens += result.prefix_cache_hit_len
            self._completion_tokens += len(result.token_ids)
            if result.token_ids:
                self._ttft.observe(result.timings.ttft_ms / 1e3)
                t = result.timings
                self._last = {"completion_tokens": len(result.token_ids),
                              "prompt_tokens": result.prompt_tokens,
                              "tokens_per_s": round(t.decode_tok_s, 2),
                              "ttft_ms": round(t.ttft_ms, 3), "total_ms": round(t.total_ms, 3),
                              "finished": round(time.time(), 3)}

    def throughput(self) -> dict[str, Any]:
        """The last answer's speed (None before one) and the running totals: what the
        app's gauges show as tokens/s and time to first token."""
        with self._lock:
            return {"answers": sum(self._generations.values()),
                    "completion_tokens_total": self._completion_tokens,
                    "last": None if self._last is None else dict(self._last)}

    def observe_job(self, record: JobRecord) -> None:
        with self._lock:
            self._jobs += 1
            self._steps_after_cancel += record.steps_after_cancel

    def render(self, *, waiting: int, busy: bool, model_loaded: bool,
               engine: EngineGauges | None = None) -> str:
        with self._lock:
            lines = [
                "# HELP worker_requests_total HTTP requests answered, by route and status.",
                "# TYPE worker_requests_total counter",
                *(f"worker_requests_total{_labels(k)} {v}" for k, v in
                  sorted(self._requests.items())),
                "# HELP worker_request_duration_seconds Time from request to last byte.",
                "# TYPE worker_request_duration_seconds histogram",
            ]
            for labels, hist in sorted(self._latency.items()):
                lines += hist.lines("worker_request_duration_seconds", labels)
            lines += [
                "# HELP engine_time_to_first_token_seconds Prefill and first token, per "
                "generation.",
                "# TYPE engine_time_to_first_token_seconds histogram",
                *self._ttft.lines("engine_time_to_first_token_seconds", ()),
                "# HELP engine_generations_total Generations finished, by why they stopped.",
                "# TYPE engine_generations_total counter",
                *(f"engine_generations_total{_labels(k)} {v}" for k, v in
                  sorted(self._generations.items())),
                "# HELP engine_prompt_tokens_total Prompt tokens processed.",
                "# TYPE engine_prompt_tokens_total counter",
                f"engine_prompt_tokens_total {self._prompt_tokens}",
                "# HELP engine_prefix_cache_hit_tokens_total Prompt tokens whose KV was reused "
                "(not prefilled).",
                "# TYPE engine_prefix_cache_hit_tokens_total counter",
                f"engine_prefix_cache_hit_tokens_total {self._cached_tokens}",
                "# HELP engine_completion_tokens_total Tokens generated.",
                "# TYPE engine_completion_tokens_total counter",
                f"engine_completion_tokens_total {self._completion_tokens}",
                "# HELP engine_jobs_total Jobs the engine thread ran.",
                "# TYPE engine_jobs_total counter",
                f"engine_jobs_total {self._jobs}",
                "# HELP engine_steps_after_cancel_total Tokens generated after a request was "
                "cancelled (a client left); at most one per cancelled request.",
                "# TYPE engine_steps_after_cancel_total counter",
                f"engine_steps_after_cancel_total {self._steps_after_cancel}",
            ]
        lines += [
            "# HELP engine_queue_waiting Requests waiting for the engine thread.",
            "# TYPE engine_queue_waiting gauge",
            f"engine_queue_waiting {waiting}",
            "# HELP engine_busy 1 while the engine thread runs a job.",
            "# TYPE engine_busy gauge",
            f"engine_busy {int(busy)}",
            "# HELP engine_model_loaded 1 while a model is loaded.",
            "# TYPE engine_model_loaded gauge",
            f"engine_model_loaded {int(model_loaded)}",
        ]
        if engine is not None:
            lines += engine.lines()
        return "\n".join(lines) + "\n"
