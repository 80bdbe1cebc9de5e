"""/health, /metrics, the library, load and unload, and the loading / no-model states."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.server.errors import ApiError
from tests.engine.server.live import MODEL_NAME, LiveServer, serve


@pytest.fixture(scope="module")
def swap(models_root: Path) -> Iterator[LiveServer]:
    """A worker whose model the tests change (not the shared one)."""
    live = serve(None, models_root)
    yield live
    live.stop()


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_count_requests_tokens_and_latency(server):
    with server.client() as http:
        before = http.get("/metrics").text
        http.post("/v1/completions", json={"prompt": "x = 1", "max_tokens": 4,
                                           "logit_bias": {"0": -100}})
        http.post("/v1/completions", json={"prompt": "x", "n": 3})
        after = http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    assert re.search(r'worker_requests_total\{route="/v1/completions",method="POST",'
                     r'status="400"\} \d+', text)
    assert _metric(text, "engine_completion_tokens_total") >= _metric(
        before, "engine_completion_tokens_total") + 4
    assert _metric(text, "engine_time_to_first_token_seconds_count") > 0
    assert "engine_prefix_cache_hit_tokens_total" in text
    assert 'worker_request_duration_seconds_bucket{route="/v1/completions",method="POST",' \
        'le="+Inf"}' in text
    assert "engine_busy 0" in text or "engine_busy 1" in text


def test_starts_empty_then_loads_lists_and_unloads(swap, models_root):
    with swap.client() as http:
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["state"] == "empty"
        none = http.post("/v1/completions", json={"prompt": "x"})
        assert none.status_code == 503 and none.headers["retry-after"]
        assert http.get("/v1/models").json()["data"] == []
    with swap.admin() as admin:
        library = admin.get("/v1/library").json()
        names = {m["name"] for m in library["models"]}
        assert {MODEL_NAME, "plain-chat"} <= names
        loaded = admin.post("/v1/models/load", json={"model": "plain-chat"})
        assert loaded.status_code == 200 and loaded.json()["id"] == "plain-chat"
        with swap.client() as http:
            assert http.get("/health").json()["state"] == "ready"
            # no FIM tokens: the prefix-only layout answers
            assert http.post("/infill", json={"input_prefix": "a", "n_predict": 2}
                             ).status_code == 200
        again = admin.post("/v1/models/load", json={"model": MODEL_NAME})
        assert again.json()["id"] == MODEL_NAME
        assert [m["loaded"] for m in admin.get("/v1/library").json()["models"]
                if m["name"] == MODEL_NAME] == [True]
        with swap.client() as http:
            assert http.post("/infill", json={"input_prefix": "a", "n_predict": 2}
                             ).status_code == 200
        gone = admin.post("/v1/models/unload", json={})
        assert gone.json() == {"unloaded": MODEL_NAME, "state": "empty"}
        assert admin.post("/v1/models/unload", json={"model": "x"}).status_code == 404


def test_a_broken_model_folder_is_a_clear_error(swap, models_root):
    broken = models_root / "broken-model"
    broken.mkdir(exist_ok=True)
    (broken / "tokenizer.json").write_text("{}")
    (broken / "genai_config.json").write_text("{}")
    with swap.admin() as admin:
        response = admin.post("/v1/models/load", json={"model": "broken-model"})
    assert response.status_code == 400
    assert "genai_config.json" in response.json()["error"]["message"]
    assert swap.ctx.models.state == "empty"


def test_loading_state_answers_503_with_retry_after(swap):
    models = swap.ctx.models
    models.state, models.loading = "loading", "some-model"
    try:
        with swap.client() as http:
            response = http.post("/v1/chat/completions",
                                 json={"messages": [{"role": "user", "content": "x"}]})
            health = http.get("/health").json()
        assert response.status_code == 503 and response.headers["retry-after"] == "2"
        assert response.json()["error"]["code"] == "model_loading"
        assert health["state"] == "loading" and health["loading"] == "some-model"
        with pytest.raises(ApiError) as info:
            models.require("")
        assert info.value.status == 503
    finally:
        models.state, models.loading = "empty", None


def test_without_a_model_resources_are_empty_and_limits_wait_for_one(swap):
    with swap.admin() as admin:
        admin.post("/v1/models/unload", json={}).raise_for_status()
        resources = admin.get("/v1/resources").json()
        assert resources["state"] == "empty" and resources["model"] is None
        assert resources["governor"] is None and resources["kv"] is None
        limits = admin.put("/v1/limits", json={"host_ram": "50%"})
        assert limits.status_code == 503 and limits.headers["retry-after"]
        assert admin.delete("/v1/sessions/any").status_code == 404
        assert "engine_kv_bytes" not in admin.get("/metrics").text
