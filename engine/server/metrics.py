"""Prometheus text exposition of what the worker did: requests, tokens, latencies.

Only what is measured is exported: prompt tokens served from reused KV come from each
result's ``prefix_cache_hit_len``; KV bytes per tier belong to the governor's snapshot
(``/v1/resources``, not here yet) and are not invented.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Sequence

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

    def observe_job(self, record: JobRecord) -> None:
        with self._lock:
            self._jobs += 1
            self._steps_after_cancel += record.steps_after_cancel

    def render(self, *, waiting: int, busy: bool, model_loaded: bool) -> str:
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
        return "\n".join(lines) + "\n"
