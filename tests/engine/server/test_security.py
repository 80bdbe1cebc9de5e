"""Auth where documented, CORS denied by default, host and body limits, model paths only
from the configured roots, the admin token file, the non-loopback warning."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.server.config import ServerConfig
from engine.server.security import ensure_admin_token
from engine.server.serve import warn_if_exposed
from tests.engine.server.live import ADMIN, MODEL_NAME, LiveServer, raw_request, serve

KEY = "sk-local-test"


@pytest.fixture(scope="module")
def keyed(model_dir: Path, models_root: Path) -> Iterator[LiveServer]:
    live = serve(model_dir, models_root, api_key=KEY, max_body_bytes=4096,
                 cors_origins=("http://localhost:3000",))
    yield live
    live.stop()


def _get(live: LiveServer, path: str, token: str | None = None, **headers: str) -> httpx.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with live.client(**headers) as http:
        return http.get(path)


@pytest.mark.parametrize("path", ["/v1/models", "/props", "/api/tags", "/metrics",
                                  "/openapi.json"])
def test_api_key_protects_every_route_but_health(keyed, path):
    assert _get(keyed, path).status_code == 401
    assert _get(keyed, path, "wrong").status_code == 401
    assert _get(keyed, path, KEY).status_code == 200
    assert _get(keyed, path, ADMIN).status_code == 200  # the admin token opens everything


def test_health_needs_no_key(keyed):
    response = _get(keyed, "/health")
    assert response.status_code == 200 and response.json()["model"] == MODEL_NAME


def test_errors_keep_each_dialects_shape(keyed):
    with keyed.client() as http:
        openai_shape = http.post("/v1/completions", json={"prompt": "x"}).json()
        llama_shape = http.post("/infill", json={}).json()
        ollama_shape = http.post("/api/generate", json={}).json()
    assert openai_shape["error"]["code"] == "invalid_api_key"
    assert llama_shape["error"]["code"] == 401
    assert isinstance(ollama_shape["error"], str)


def test_admin_routes_always_need_the_admin_token(keyed, server):
    assert _get(keyed, "/v1/library", KEY).status_code == 403
    assert _get(keyed, "/v1/library").status_code == 401
    assert _get(keyed, "/v1/library", ADMIN).status_code == 200
    assert _get(server, "/v1/library").status_code == 401  # no API key configured: still needed
    assert _get(server, "/v1/library", ADMIN).status_code == 200


def test_empty_bearer_is_accepted_without_an_api_key(server):
    status, _ = raw_request(server.url, "GET", "/v1/models", b"", {"Authorization": "Bearer "})
    assert status == 200


def test_cors_preflight_is_denied_by_default(server):
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    with server.client(**preflight) as http:
        response = http.options("/v1/chat/completions")
        assert response.status_code == 403
        assert "access-control-allow-origin" not in response.headers
        simple = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert simple.status_code == 403  # a page cannot even trigger generation


def test_cors_allows_only_the_configured_origin(keyed):
    headers = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization,content-type"}
    with keyed.client(**headers) as http:
        response = http.options("/v1/chat/completions")
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert _get(keyed, "/v1/models", KEY, Origin="http://localhost:3000").headers[
        "access-control-allow-origin"] == "http://localhost:3000"
    assert _get(keyed, "/v1/models", KEY, Origin="http://localhost:3001").status_code == 403


def test_foreign_host_header_is_refused_on_loopback(server):
    status, _ = raw_request(server.url, "GET", "/v1/models", b"", {})
    assert status == 200
    with server.client(Host="attacker.example:8012") as http:
        assert http.get("/v1/models").status_code == 403


def test_body_size_limit_declared_and_streamed(keyed):
    big = b'{"prompt": "' + b"x" * 8000 + b'"}'
    with keyed.client(Authorization=f"Bearer {KEY}") as http:
        declared = http.post("/v1/completions", content=big,
                             headers={"Content-Type": "application/json"})
        assert declared.status_code == 413

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(big), 1000):
                yield big[start:start + 1000]

        streamed = http.post("/v1/completions", content=chunks(),
                             headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413


@pytest.mark.parametrize("name,status", [
    ("../outside", 400), ("plain-chat/../../outside", 400), ("/etc", 403),
    ("does-not-exist", 404), ("escape-link", 404)])
def test_model_paths_only_from_the_configured_roots(keyed, models_root, name, status):
    link = models_root / "escape-link"
    if not link.exists():
        link.symlink_to(models_root.parent, target_is_directory=True)
    with keyed.admin() as http:
        response = http.post("/v1/models/load", json={"model": name})
    assert response.status_code == status, response.text
    assert keyed.ctx.models.current is not None  # the served model is untouched


def test_admin_token_file_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    token, path = ensure_admin_token(None)
    assert path.is_relative_to(tmp_path / "config")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) >= 32
    assert ensure_admin_token(None) == (token, path)  # read back, not regenerated
    os.chmod(path, 0o644)
    assert ensure_admin_token(path)[0] == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_non_loopback_bind_warns_loudly(caplog):
    with caplog.at_level(logging.WARNING):
        warn_if_exposed(ServerConfig(host="0.0.0.0"))
    assert "0.0.0.0" in caplog.text and "NO --api-key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_if_exposed(ServerConfig(host="127.0.0.1"))
    assert caplog.text == ""
