"""A worker serving a model whose metadata declares a sliding window with attention sinks:
prompts and answers longer than the model's context are answered, and /v1/resources says
how many KV rows a sequence keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.engine.kv.test_window import CONTEXT, ROWS, SINKS, WINDOW, _metadata
from tests.engine.server.live import serve
from tests.forge import ForgeSpec, write_genai_model


def test_a_windowed_model_answers_a_prompt_longer_than_its_context(tmp_path: Path):
    spec = ForgeSpec(layers=2, context=CONTEXT)
    folder = _metadata(write_genai_model(tmp_path / "windowed", spec), spec)
    prompt = [int(i) for i in np.random.default_rng(3).integers(9, 500, CONTEXT + 40)]
    live = serve(folder)
    try:
        with live.client() as http:
            answer = http.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": 30, "temperature": 0})
            kv = http.get("/v1/resources").json()["kv"]
    finally:
        live.stop()
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"]["prompt_tokens"] == CONTEXT + 40
    assert body["usage"]["completion_tokens"] == 30
    assert body["choices"][0]["finish_reason"] == "length"  # max_tokens, not the context
    assert kv["window"] == {"attention_sinks": SINKS, "sliding_window": WINDOW,
                            "drop": WINDOW // 8, "kv_rows": ROWS}
