"""A model's recommended sampling fills in what a request leaves out, on every dialect,
and the routes show each value with where it came from."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import GenerateOptions
from engine.model.default_model import default_model_dir
from engine.model.sampling_defaults import model_sampling
from tests.engine.server.live import LiveServer, serve

GEN_CONFIG = {"do_sample": True, "temperature": 0.3, "top_p": 0.85, "top_k": 7,
              "repetition_penalty": 1.2}


class Recorder:
    """The options of every request the routes hand to the engine thread (the request
    itself runs as always)."""

    def __init__(self, live: LiveServer) -> None:
        self.options: list[GenerateOptions] = []
        submit = live.ctx.submit

        def recording(model: Any, request: Any, **kwargs: Any) -> Any:
            self.options.append(request.options)
            return submit(model, request, **kwargs)

        live.ctx.submit = recording  # type: ignore[method-assign]

    @property
    def last(self) -> GenerateOptions:
        return self.options[-1]


@pytest.fixture(scope="module")
def recommending(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test model with a generation_config.json of its own."""
    folder = tmp_path_factory.mktemp("recommending") / "recommending-chat"
    shutil.copytree(models_root / "plain-chat", folder)
    (folder / "generation_config.json").write_text(json.dumps(GEN_CONFIG), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def presets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "presets.json"
    path.write_text(json.dumps({"recommending-chat": {
        "num_predict": 5, "min_p": 0.02, "infill": {"temperature": 0.4, "repeat_penalty": 1.05}}}),
        encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def live(recommending: Path, presets: Path) -> Iterator[tuple[LiveServer, Recorder]]:
    server = serve(recommending, presets=presets)
    yield server, Recorder(server)
    server.stop()


def _picked(options: GenerateOptions) -> dict[str, Any]:
    return {"temperature": options.temperature, "top_p": options.top_p,
            "top_k": options.top_k, "repetition_penalty": options.repetition_penalty,
            "min_p": options.min_p, "max_new_tokens": options.max_new_tokens}


def test_recommendations_come_from_the_preset_then_the_models_configs(tmp_path: Path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "genai_config.json").write_text(json.dumps({"search": {
        "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
        "repetition_penalty": 1.0}}), encoding="utf-8")
    boilerplate = model_sampling(folder, ["m"])
    assert boilerplate.general == {}  # the builder's values recommend nothing
    assert boilerplate.table("ollama")["temperature"] == {"value": 0.8,
                                                         "source": "Ollama default"}
    (folder / "genai_config.json").write_text(json.dumps({"search": {
        "temperature": 0.6, "top_k": 20, "top_p": 1.0}}), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.5}),
                                                   encoding="utf-8")
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps({"M:latest": {"repeat_penalty": 1.3, "colour": 2},
                                   "*": {"top_p": 0.5}}), encoding="utf-8")
    table = model_sampling(folder, ["m"], presets).table("openai")
    assert table["temperature"] == {"value": 0.5, "source": "generation_config.json"}
    assert table["top_k"] == {"value": 20, "source": "genai_config.json"}
    assert table["repetition_penalty"] == {"value": 1.3, "source": "preset"}
    assert table["top_p"] == {"value": 0.5, "source": "preset (*)"}
    assert table["min_p"] == {"value": 0.0, "source": "OpenAI default"}
    problems = model_sampling(folder, ["m"], presets).problems
    assert len(problems) == 1 and "colour: not a sampling field" in problems[0]


def test_the_built_in_model_recommends_what_the_app_samples_it_with():
    folder = default_model_dir()
    if folder is None:
        pytest.skip("the built-in model is not installed")
    table = model_sampling(folder, [folder.name]).table("openai")
    assert {k: table[k] for k in ("temperature", "top_p", "repetition_penalty")} == {
        "temperature": {"value": 0.2, "source": "generation_config.json"},
        "top_p": {"value": 0.9, "source": "generation_config.json"},
        "repetition_penalty": {"value": 1.1, "source": "generation_config.json"}}


@pytest.mark.parametrize(("path", "body", "dialect_top_k", "dialect_min_p"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 7, 0.02),
    ("/v1/completions", {"prompt": "hi"}, 7, 0.02),
    ("/completion", {"prompt": "hi"}, 7, 0.02),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False}, 7, 0.02),
    ("/api/generate", {"prompt": "hi", "stream": False}, 7, 0.02),
])
def test_a_bare_request_gets_the_models_recommendations_on_every_dialect(
        live, path, body, dialect_top_k, dialect_min_p):
    server, recorder = live
    with server.client() as http:
        response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    assert _picked(recorder.last) == {"temperature": 0.3, "top_p": 0.85, "top_k": dialect_top_k,
                                      "repetition_penalty": 1.2, "min_p": dialect_min_p,
                                      "max_new_tokens": 5}


def test_fields_a_request_sends_still_win(live):
    server, recorder = live
    with server.client() as http:
        response = http.post("/api/chat", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": False,
            "options": {"temperature": 0.9, "num_predict": 2, "repeat_penalty": 1.0}})
    assert response.status_code == 200, response.text
    picked = _picked(recorder.last)
    assert (picked["temperature"], picked["max_new_tokens"], picked["repetition_penalty"]) == (
        0.9, 2, 1.0)
    assert picked["top_p"] == 0.85  # what it left out is still the model's


def test_code_completion_takes_only_the_presets_infill_values(live, recommending: Path):
    server, recorder = live
    with server.client() as http:
        for path, body in (("/infill", {"input_prefix": "def f(", "input_suffix": ")\n",
                                        "n_predict": 3}),
                           ("/api/generate", {"prompt": "def f(", "suffix": ")\n",
                                              "stream": False, "options": {"num_predict": 3}}),
                           ("/v1/completions", {"prompt": "def f(", "suffix": ")\n",
                                                "max_tokens": 3})):
            response = http.post(path, json=body)
            assert response.status_code == 200, response.text
            options = recorder.last
            assert (options.temperature, options.repetition_penalty) == (0.4, 1.05), path


def test_code_completion_is_greedy_without_a_preset(models_root: Path):
    server = serve(models_root / "qwen2.5-coder-1.5b")
    recorder = Recorder(server)
    try:
        with server.client() as http:
            response = http.post("/infill", json={"input_prefix": "def f(",
                                                  "input_suffix": ")\n", "n_predict": 3})
            assert response.status_code == 200, response.text
            assert recorder.last.temperature == 0.0
            props = http.get("/props").json()["default_generation_settings"]
            assert props["infill"]["temperature"] == {"value": 0.0,
                                                      "source": "code completion: greedy"}
            response = http.post("/completion", json={"prompt": "hi", "n_predict": 2})
            assert response.status_code == 200, response.text
            assert _picked(recorder.last) == {"temperature": 0.8, "top_p": 0.95, "top_k": 40,
                                              "repetition_penalty": 1.0, "min_p": 0.05,
                                              "max_new_tokens": 2}
    finally:
        server.stop()


def test_the_routes_show_each_value_and_where_it_came_from(live):
    server, _ = live
    with server.client() as http:
        card = http.get("/v1/models").json()["data"][0]["meta"]
        props = http.get("/props").json()["default_generation_settings"]
        show = http.post("/api/show", json={"model": "recommending-chat"}).json()
    assert card["sampling"]["temperature"] == {"value": 0.3, "source": "generation_config.json"}
    assert card["sampling"]["max_tokens"] == {"value": 5, "source": "preset"}
    assert card["sampling"]["presence_penalty"] == {"value": 0.0, "source": "OpenAI default"}
    assert props["params"]["temperature"] == 0.3 and props["params"]["top_k"] == 7
    assert props["params"]["repeat_penalty"] == 1.2 and props["params"]["n_predict"] == 5
    assert props["sampling"]["top_p"] == {"value": 0.85, "source": "generation_config.json"}
    assert props["infill"]["temperature"] == {"value": 0.4, "source": "preset"}
    assert show["sampling"]["min_p"] == {"value": 0.02, "source": "preset"}
    assert "PARAMETER temperature 0.3" in show["modelfile"]
    assert "PARAMETER repeat_penalty 1.2" in show["modelfile"]
    assert "PARAMETER num_predict 5" in show["modelfile"]
    assert "top_k" in show["parameters"]


def test_a_preset_value_out_of_range_is_named_and_left_out(tmp_path: Path):
    """A Modelfile's ``num_predict -1`` means no limit (not a 400 on every request), and a
    value outside the request ranges is left out with a problem instead of reaching the
    sampler on one dialect and a 400 on another."""
    folder = tmp_path / "m"
    folder.mkdir()
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps({"m": {"num_predict": -1, "temperature": -1, "top_p": 5,
                                         "repeat_penalty": 0, "top_k": 30}}),
                       encoding="utf-8")
    sampling = model_sampling(folder, ["m"], presets)
    assert set(sampling.general) == {"top_k"}
    assert sampling.table("openai")["top_k"] == {"value": 30, "source": "preset"}
    problems = " ".join(sampling.problems)
    assert "temperature: expected 0 to 100, got -1" in problems
    assert "top_p: expected 0 to 1, got 5" in problems
    assert "repetition_penalty: expected 0.01 to 100, got 0" in problems
    assert "max_tokens" not in problems
