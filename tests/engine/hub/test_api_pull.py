"""Ollama's ``POST /api/pull`` on a real worker: streamed status lines while a forged GGUF
repository is pulled from the Hub stand-in into the worker's model folder; the model is
then in the worker's library (GET /v1/library), loads by its name and answers
/api/generate."""

from __future__ import annotations

import json

import pytest

from tests.app.hub_standin import HubStandin
from tests.engine.hub.repos import GGUF_REPO, UNSUPPORTED_REPO, gguf_repo, unsupported_repo
from tests.engine.server.live import serve


@pytest.fixture
def hub(tmp_path, monkeypatch):
    repos = {GGUF_REPO: gguf_repo(tmp_path / "repos"),
             UNSUPPORTED_REPO: unsupported_repo(tmp_path / "repos")}
    with HubStandin(repos) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        yield standin


def test_api_pull_streams_status_lines_and_the_model_is_served(hub, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    live = serve(None, models)
    try:
        with live.client() as plain:
            refused = plain.post("/api/pull", json={"model": GGUF_REPO})
            assert refused.status_code == 401  # it writes into the library: admin only
        with live.admin() as admin, admin.stream("POST", "/api/pull",
                                                 json={"model": GGUF_REPO}) as response:
            assert response.status_code == 200
            lines = [json.loads(line) for line in response.iter_lines() if line]
        statuses = [line.get("status", "") for line in lines]
        assert statuses[0] == "pulling manifest"
        assert any(s.startswith("pulling ") and line.get("total")
                   for s, line in zip(statuses, lines, strict=True))
        assert "verifying sha256 digest" in statuses
        assert statuses[-1] == "success" and lines[-1]["model"] == "Tiny-q4_k_m"
        assert "Q4_K_M" in lines[-1]["detail"]
        with live.admin() as admin:
            library = admin.get("/v1/library").json()
            assert "Tiny-q4_k_m" in json.dumps(library), library
            loaded = admin.post("/v1/models/load", json={"model": "Tiny-q4_k_m"})
            assert loaded.status_code == 200, loaded.text
        with live.client() as client:
            answer = client.post("/api/generate", json={
                "model": loaded.json()["id"], "prompt": "hello", "stream": False,
                "options": {"num_predict": 4, "temperature": 0}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["done"] is True
        with live.admin() as admin:
            bad = admin.post("/api/pull", json={"model": UNSUPPORTED_REPO, "stream": False})
            assert bad.status_code == 400
            assert "nothing this engine runs" in bad.text
    finally:
        live.stop()
