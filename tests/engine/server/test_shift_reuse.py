"""Reuse by shifting through the worker: a chat whose oldest exchange is left out and an
editor's moved window prefill only their new tokens (``usage...cached_tokens``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from engine import EngineConfig
from tests.engine.server.live import LiveServer, serve, write_model
from tests.forge import ForgeSpec

GREEDY = {"temperature": 0, "logit_bias": {"0": -100}}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda",
         "sigma", "omega", "river", "stone", "cloud", "paper", "window", "garden", "yellow",
         "silver", "quiet"]


def _text(seed: int, words: int = 120) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), words))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("shift") / "shift-chat", ForgeSpec(context=2048))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
    live = serve(model_dir, engine=EngineConfig(intra_op_threads=1))  # --cache-reuse 256
    yield live
    live.stop()


def _chat(http: httpx.Client, turns: list[dict[str, str]], session: str) -> dict[str, Any]:
    response = http.post("/v1/chat/completions", headers={"X-Session-Id": session},
                         json={"messages": turns, "max_tokens": 8, **GREEDY})
    assert response.status_code == 200, response.text
    return response.json()


def _prefilled(body: dict[str, Any]) -> int:
    usage = body["usage"]
    return usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("slot_taken", [False, True])
def test_a_chat_with_its_oldest_exchange_left_out_prefills_what_a_normal_turn_does(
        server, slot_taken):
    full, short = f"full-{slot_taken}", f"left-out-{slot_taken}"  # twin conversations
    turns: list[dict[str, str]] = [{"role": "system", "content": "You answer briefly."}]
    with server.client() as http:
        for i in range(3):
            turns.append({"role": "user", "content": _text(10 * i + int(slot_taken))})
            answer = _chat(http, turns, full)["choices"][0]["message"]["content"]
            assert _chat(http, turns, short)["choices"][0]["message"]["content"] == answer
            turns.append({"role": "assistant", "content": answer})
        last = {"role": "user", "content": "And the last one?"}
        normal = _chat(http, [*turns, last], full)
        if slot_taken:  # another request takes the engine's KV slot between the turns
            http.post("/v1/completions", json={"prompt": "unrelated", "max_tokens": 3})
        # "leave older messages out": the first exchange is not sent any more
        left_out = _chat(http, [turns[0], *turns[3:], last], short)
    assert left_out["usage"]["prompt_tokens"] > 600
    # before: everything after the system message was prefilled again
    assert _prefilled(left_out) <= _prefilled(normal)


def test_an_editor_window_moved_over_a_file_prefills_only_the_new_lines(server):
    file_ids = [int(i) for i in np.random.default_rng(7).integers(9, 500, 1800)]
    window, step = 1000, 160
    with server.client() as http:
        def complete(ids: list[int]) -> dict[str, Any]:
            response = http.post("/v1/completions",
                                 json={"prompt": ids, "max_tokens": 4, **GREEDY})
            assert response.status_code == 200, response.text
            return response.json()

        complete(file_ids[:window])
        body = complete(file_ids[step:step + window])
    assert body["usage"]["prompt_tokens"] == window
    assert _prefilled(body) == step  # before: the whole window (nothing shared at its start)


def test_enter_in_an_editor_window_of_a_few_hundred_tokens_prefills_only_the_new_line(server):
    # an /infill-sized prompt (the prefix-only layout's 512-token budget): a header of the
    # window's first lines, then its last lines. Enter drops the window's first line (the
    # header shifts and shrinks) and the body's first lines, and adds a line at the end:
    # no run reaches the default --cache-reuse 256 but the body's, none of 64 tokens but
    # the header's and the body's
    ids = [int(i) for i in np.random.default_rng(11).integers(9, 500, 1000)]
    header, body = ids[:100], ids[300:650]
    typed = ids[900:906]
    with server.client() as http:
        def complete(prompt: list[int]) -> dict[str, Any]:
            response = http.post("/v1/completions",
                                 json={"prompt": prompt, "max_tokens": 4, **GREEDY})
            assert response.status_code == 200, response.text
            return response.json()

        cold = complete(header + body)
        after_enter = complete(header[20:] + body[30:] + typed)
    cold_prompt = cold["usage"]["prompt_tokens"]
    assert cold_prompt == 450
    # before: the shifted header (80 tokens, under 256) was prefilled again: 86 of 450
    assert _prefilled(after_enter) <= cold_prompt // 10
