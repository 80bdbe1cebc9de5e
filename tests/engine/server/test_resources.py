"""/v1/resources and its stream, PUT /v1/limits, and the memory figures of /metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.memory.governor import GovernorSnapshot
from engine.server.resources import limit_text
from tests.engine.server.live import MODEL_NAME, LiveServer, serve, sse_events


@pytest.fixture(scope="module")
def limited(model_dir: Path) -> Iterator[LiveServer]:
    """A worker whose limits the tests change (not the shared one)."""
    live = serve(model_dir)
    yield live
    live.stop()


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    return float(match.group(1))


def test_resources_are_the_governor_snapshot_and_the_kv_figures(server):
    with server.client() as http:
        for prompt in ("def f(x):\n" * 20, "import os\n" * 12):  # the second moves the
            answer = http.post("/v1/completions",     # first one's pages to the cache
                               json={"prompt": prompt, "max_tokens": 2})
            assert answer.status_code == 200, answer.text
        body = http.get("/v1/resources").json()
    assert body["model"] == MODEL_NAME and body["state"] == "ready" and body["fresh"] is True
    snap = GovernorSnapshot.from_dict(body["governor"])  # the engine's own type, whole
    assert snap.kv_tier == "host_ram" and snap.runtime_override
    host = snap.host_ram
    assert host.weights_bytes > 0 and host.kv_bytes > 0 and host.used >= host.weights_bytes
    assert snap.breakdown.kv_host_ram_bytes == host.kv_bytes
    kv = body["kv"]
    assert kv["held_bytes"] == host.kv_bytes  # reported on the engine thread just now
    assert kv["page_tokens"] == 32 and kv["pool"]["pages"] >= kv["prefix_cache"]["pages"] >= 1
    assert kv["sessions"]["max_named"] == 64 and kv["store"] is None


def test_resources_report_the_last_answers_tokens_per_second_and_ttft(server):
    asked_at = time.time()
    with server.client() as http:
        before = http.get("/v1/resources").json()["throughput"]
        answer = http.post("/v1/completions", json={"prompt": "def add(a, b):",
                                                    "max_tokens": 6, "temperature": 0})
        assert answer.status_code == 200, answer.text
        after = http.get("/v1/resources").json()["throughput"]
    tokens = answer.json()["usage"]["completion_tokens"]
    assert after["answers"] == before["answers"] + 1
    assert after["completion_tokens_total"] == before["completion_tokens_total"] + tokens
    last = after["last"]
    assert last["completion_tokens"] == tokens and last["prompt_tokens"] > 0
    assert last["tokens_per_s"] > 0 and 0 < last["ttft_ms"] <= last["total_ms"]
    assert asked_at <= last["finished"] <= time.time()  # when it finished, as a Unix time


def test_the_stream_sends_an_event_every_interval_until_the_client_leaves(server):
    events = []
    with server.client() as http:
        with http.stream("GET", "/v1/resources/stream",
                         params={"interval_s": 0.2}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for event in sse_events(response.iter_lines()):
                events.append(event)
                if len(events) == 3:
                    break
        started = time.perf_counter()
        bounded = http.get("/v1/resources/stream", params={"max_events": 3, "interval_s": 0.2})
        took = time.perf_counter() - started
    assert all(e["governor"]["kv_tier"] == "host_ram" for e in events)
    assert bounded.text.count("data: ") == 3
    # paced, not sent at once: two intervals at least between the first and the third (a
    # lower bound: a busy machine only makes it longer)
    assert took >= 0.4


def test_metrics_export_kv_bytes_per_tier_and_prefix_cache_hits(server):
    prompt = "import sys\n" * 8  # 64 tokens: two pages
    with server.client() as http:
        before = http.get("/metrics").text
        # an unrelated prompt takes the KV slot in between (the first prompt's pages go to
        # the prefix cache), so the third prompt is served from the prefix cache
        for text in (prompt, "class Unrelated:\n    pass\n" * 4,
                     prompt + "print(value)\n" * 8):
            answer = http.post("/v1/completions", json={"prompt": text, "max_tokens": 2})
            assert answer.status_code == 200, answer.text
        after = http.get("/metrics").text
    assert _metric(after, 'engine_kv_bytes{tier="host_ram"}') > 0
    assert _metric(after, 'engine_kv_bytes{tier="vram"}') == 0
    assert _metric(after, 'engine_kv_bytes{tier="disk"}') == 0
    assert _metric(after, 'engine_memory_used_bytes{tier="host_ram"}') > 0
    assert _metric(after, "engine_prefix_cache_hits_total") >= _metric(
        before, "engine_prefix_cache_hits_total") + 1
    assert _metric(after, "engine_prefix_cache_pages") >= 1
    assert 'engine_sessions{kind="named"}' in after
    assert "# TYPE engine_kv_bytes gauge" in after


def test_limits_need_the_admin_token_and_a_valid_value(limited):
    with limited.client() as http:
        assert http.put("/v1/limits", json={"host_ram": "50%"}).status_code == 401
    with limited.admin() as admin:
        bad = admin.put("/v1/limits", json={"host_ram": "8 potatoes"})
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["param"] == "host_ram"
        assert "50%" in error["message"] and "8GiB" in error["message"]  # the accepted forms
        assert "GiB" in admin.put("/v1/limits", json={"vram": "8"}).json()["error"]["message"]
        for body in ({}, {"host_ram": "50%", "vram": "2GiB"}, {"ram": "1GiB"},
                     {"host_ram": -1}, {"disk": "150%"}):
            assert admin.put("/v1/limits", json=body).status_code == 400, body


def test_lowering_a_limit_frees_cached_kv_and_reports_the_outcome(limited):
    with limited.client() as http:
        for i in range(3):
            answer = http.post("/v1/completions", json={
                "prompt": f"# {i}\n" + "x = 1\n" * 30, "max_tokens": 2})
            assert answer.status_code == 200, answer.text
        before = http.get("/v1/resources").json()["kv"]
    assert before["prefix_cache"]["pages"] >= 3
    with limited.admin() as admin, limited.client() as http:
        try:
            low = admin.put("/v1/limits", json={"host_ram": "64KiB"})
            assert low.status_code == 200, low.text
            outcome = low.json()
            after = http.get("/v1/resources").json()
        finally:
            restored = admin.put("/v1/limits", json={"host_ram": "auto"})
        assert restored.json()["change"]["previous"] == "64KiB"
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}
                         ).status_code == 200
    change = outcome["change"]
    assert change["tier"] == "host_ram" and change["configured"] == "64KiB"
    assert change["limit_bytes"] == 1 << 16 and change["excess_bytes"] > 0
    assert outcome["pages_evicted"] == before["prefix_cache"]["pages"]
    assert outcome["bytes_freed"] >= outcome["pages_evicted"] * before["page_bytes"]
    assert outcome["still_over"] is True  # the weights alone are over 64 KiB
    assert outcome["requests_preempted"] == 0
    assert after["kv"]["prefix_cache"]["pages"] == 0
    assert after["governor"]["host_ram"]["limit"] == 1 << 16


def test_numbers_are_limits_too_and_a_disabled_override_is_a_409(limited):
    governor = limited.ctx.models.current.engine.governor
    with limited.admin() as admin:
        half = admin.put("/v1/limits", json={"host_ram": 0.5}).json()["change"]
        assert half["configured"] == "0.5" and half["previous"] == "auto"
        admin.put("/v1/limits", json={"host_ram": "auto"}).raise_for_status()
        governor.runtime_override = False
        try:
            refused = admin.put("/v1/limits", json={"host_ram": "50%"})
        finally:
            governor.runtime_override = True
    assert refused.status_code == 409
    assert "runtime override" in refused.json()["error"]["message"]
    assert limit_text(1e-05) == "0.00001" and limit_text(8589934592.0) == "8589934592"
    assert limit_text(1 << 30) == str(1 << 30) and limit_text("2GiB") == "2GiB"


def test_a_limit_change_does_not_wait_for_a_running_generation(slow_server):
    engine = slow_server.ctx.models.current.engine
    bias = {"0": -100, str(engine.tokenizer.token_to_id("<|im_end|>")): -100}
    body = {"prompt": "x", "max_tokens": 120, "stream": True, "temperature": 0,
            "logit_bias": bias}
    with slow_server.client() as http, slow_server.admin() as admin, \
            http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        change = admin.put("/v1/limits", json={"host_ram": "auto"})
        still_generating = not slow_server.ctx.worker.idle
        events = list(sse_events(lines))
    assert change.status_code == 200
    assert still_generating  # the change came back while the 120 tokens were being made
    finish = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict)]
    assert finish[-1] == "length"  # the generation went on to its end


def test_the_stream_ends_when_the_server_begins_to_stop(model_dir: Path):
    """An open resources stream (the app keeps one) must not hold a graceful stop until
    its deadline: it ends, whole, as soon as the server is told to stop."""
    import httpx

    live = serve(model_dir)
    try:
        with live.client() as http, http.stream("GET", "/v1/resources/stream",
                                                params={"interval_s": 0.2}) as response:
            lines = response.iter_lines()
            assert next(sse_events(lines))["state"] == "ready"
            live.server.should_exit = True  # what SIGTERM and the parent watch do
            try:
                rest = list(sse_events(lines))  # to the stream's own end
            except httpx.HTTPError as exc:  # cut off by the graceful stop's deadline
                pytest.fail(f"the stream was cut off instead of ending: {exc!r}")
        assert len(rest) <= 1  # the event under way, if any
    finally:
        live.stop()
    assert not live._thread.is_alive()
