"""Streaming is incremental, and a client that leaves frees the engine within one token
(on a model slow enough, ~7 ms a token, to see it). What these tests hold is the order of
events (a chunk arrives while the engine is still generating; a cancelled job yields at
most one more token), never a wall-clock bound: `python -m bench.latency` measures the
latencies (first chunk after the first token, engine free after a disconnect)."""

from __future__ import annotations

import json
import socket
import threading
import time

from tests.engine.server.live import LiveServer, serve, sse_events

LONG = {"n_predict": 60, "temperature": 0, "samplers": ["temperature"], "ignore_eos": True}


def test_each_token_is_sent_while_the_engine_is_still_generating(slow_server: LiveServer):
    slow_server.wait_idle()
    events: list[dict] = []
    busy_at_token: list[bool] = []
    with slow_server.client() as http, http.stream(
            "POST", "/completion", json={"prompt": "def g(y):\n" * 20, "stream": True,
                                         **{**LONG, "n_predict": 200}}) as response:
        for event in sse_events(response.iter_lines()):
            events.append(event)
            if event.get("tokens"):
                busy_at_token.append(not slow_server.ctx.worker.idle)
    final = events[-1]
    assert final["stop"] is True and final["timings"]["predicted_n"] == 200
    assert len(busy_at_token) == 200  # one event per token
    # a stream held back until the end would find the engine done at its first chunk
    assert all(busy_at_token[:100]), busy_at_token.index(False)


def test_openai_chat_stream_is_incremental_too(slow_server: LiveServer):
    slow_server.wait_idle()
    busy_at_chunk: list[bool] = []
    with slow_server.client() as http, http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 200, "temperature": 0, "logit_bias": {"0": -100},
            "stream_options": {"include_usage": True}}) as response:
        for event in sse_events(response.iter_lines()):
            if isinstance(event, dict) and event.get("choices") \
                    and event["choices"][0]["delta"].get("content"):
                busy_at_chunk.append(not slow_server.ctx.worker.idle)
    assert len(busy_at_chunk) >= 150
    assert all(busy_at_chunk[:50])  # the first content chunks long before the end


def test_disconnect_mid_stream_cancels_within_one_token(slow_server: LiveServer):
    slow_server.wait_idle()
    with slow_server.client() as http, http.stream(
            "POST", "/completion", json={"prompt": "import os\n", "stream": True,
                                         **{**LONG, "n_predict": 800}}) as response:
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("data: "):
                seen += 1
                if seen == 2:
                    break
    slow_server.wait_idle()
    record = slow_server.ctx.worker.history[-1]
    assert record.cancelled and record.steps_after_cancel <= 1
    assert record.items < 100  # far from the 800 tokens asked for
    with slow_server.client() as http:  # the next request runs normally
        body = http.post("/completion", json={"prompt": "x", "n_predict": 3}).json()
    assert body["tokens_predicted"] <= 3 and body["stop"] is True


def test_disconnect_while_waiting_for_a_non_streamed_answer_cancels_it(slow_server):
    slow_server.wait_idle()
    host, port = slow_server.url.rsplit("/", 1)[-1].split(":")
    body = json.dumps({"input_prefix": "def f():\n", "input_suffix": "", **LONG,
                       "n_predict": 800}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /infill HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        time.sleep(0.15)
    slow_server.wait_idle()
    record = slow_server.ctx.worker.history[-1]
    assert record.cancelled and record.items < 200


def test_a_full_queue_answers_429_with_retry_after(slow_model_dir):
    live = serve(slow_model_dir, max_queue=1)
    running_at_once = live.ctx.worker.max_running  # the engine's batch
    done = threading.Event()

    def long_request(prompt: str) -> None:
        with live.client() as other, other.stream("POST", "/completion", json={
                "prompt": prompt, "stream": True, **{**LONG, "n_predict": 800}}) as resp:
            for _ in resp.iter_lines():
                if done.is_set():
                    return  # hang up: the server cancels the request

    try:
        threads = [threading.Thread(target=long_request, args=(f"p{i}",))
                   for i in range(running_at_once + 1)]  # the batch, plus one waiting
        for thread in threads:
            thread.start()
        while live.ctx.worker.waiting < 1:
            time.sleep(0.001)
        with live.client() as http:
            refused = http.post("/v1/completions", json={"prompt": "z"})
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "server_busy"
        done.set()
        for thread in threads:
            thread.join(60)
    finally:
        done.set()
        live.stop()


def test_an_editor_completion_does_not_wait_behind_a_streaming_chat(slow_server: LiveServer):
    slow_server.wait_idle()
    chat_done = threading.Event()
    chat_tokens = []

    def chat() -> None:
        with slow_server.client() as http, http.stream("POST", "/completion", json={
                "prompt": "class A:\n" * 10, "stream": True,
                **{**LONG, "n_predict": 300}}) as response:
            for event in sse_events(response.iter_lines()):
                if isinstance(event, dict) and event.get("tokens"):
                    chat_tokens.append(time.perf_counter())
        chat_done.set()

    thread = threading.Thread(target=chat)
    thread.start()
    while len(chat_tokens) < 5:
        time.sleep(0.005)
    with slow_server.client() as http:
        answer = http.post("/infill", json={"input_prefix": "def add(a, b):\n    return ",
                                            "input_suffix": "\n", "n_predict": 8,
                                            "temperature": 0})
    assert answer.status_code == 200
    assert not chat_done.is_set()  # the completion came back while the chat streamed
    thread.join(60)
    assert len(chat_tokens) == 300
