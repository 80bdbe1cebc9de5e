"""Chat sessions named with X-Session-Id: the same answers, only the new turn prefilled,
rewind on an edited conversation, busy / delete / cap / idle rules."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from engine import ChatMessage, Engine, GenerateOptions, GenerateRequest
from engine.kv.reuse import common_prefix_len
from engine.server.errors import ApiError
from engine.server.sessions import SessionRegistry, plan_turn
from tests.engine.server.live import MODEL_NAME, LiveServer, sse_events

GREEDY = {"temperature": 0, "logit_bias": {"0": -100}}
SYSTEM = {"role": "system", "content": "You write Python."}


def _messages(turns: list[dict[str, str]]) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(m["role"], m["content"]) for m in turns)


def _solo(engine: Engine, turns: list[dict[str, str]], n: int) -> str:
    """The answer of the engine alone (no server, no session)."""
    options = GenerateOptions(temperature=0.0, max_new_tokens=n, logit_bias={0: -100.0})
    return engine.generate(GenerateRequest(messages=_messages(turns), options=options)).text


def _chat(http: httpx.Client, turns: list[dict[str, str]], session: str | None = None,
          n: int = 8) -> httpx.Response:
    headers = {"X-Session-Id": session} if session is not None else {}
    response = http.post("/v1/chat/completions", headers=headers,
                         json={"messages": turns, "max_tokens": n, **GREEDY})
    assert response.status_code == 200, response.text
    return response


def _session_state(server: LiveServer, name: str) -> tuple[list[int], int]:
    """The served engine session's tokens and KV length (read while the engine is idle)."""
    server.wait_idle()
    current = server.ctx.models.current
    assert current is not None
    engine = current.engine
    entry = server.ctx.sessions.lookup(engine, name)
    assert entry is not None
    session = engine.sessions.get(entry.session_id)
    return list(session.tokens), session.kv_len


def _cached(body: dict[str, Any]) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_plan_turn_keeps_the_common_prefix_and_runs_the_rest():
    assert plan_turn([1, 2, 3], [1, 2, 3, 4, 5]) == (0, [4, 5])
    assert plan_turn([1, 2, 9, 9], [1, 2, 3, 4]) == (2, [3, 4])
    assert plan_turn([1, 2, 3], [1, 2, 3]) == (1, [3])  # the last prompt token always runs
    assert plan_turn([], [7]) == (0, [7])


def test_second_turn_prefills_only_the_new_part_and_answers_the_same(server, engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    turn1: list[Any] = [SYSTEM, {"role": "user", "content": "Write fib."}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=turn1, max_tokens=8, extra_body=GREEDY,
        extra_headers={"X-Session-Id": "conv-1"})
    assert raw.headers["x-session-id"] == "conv-1"
    first = raw.parse()
    assert first.choices[0].message.content == _solo(engine, turn1, 8)
    assert first.usage is not None
    prompt1 = first.usage.prompt_tokens
    history, kv_len = _session_state(server, "conv-1")
    with server.client() as http:
        # another request takes the engine's KV slot between the turns
        http.post("/v1/completions", json={"prompt": "unrelated", "max_tokens": 3})
        turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now with memoization."}]
        second = _chat(http, turn2, "conv-1").json()
        plain = _chat(http, turn2).json()
    expected = _solo(engine, turn2, 8)
    assert second["choices"][0]["message"]["content"] == expected
    assert plain["choices"][0]["message"]["content"] == expected
    prompt2 = engine.encode_request(GenerateRequest(messages=_messages(turn2)))
    keep = common_prefix_len(history, prompt2, len(prompt2) - 1)
    assert keep >= prompt1 - 1  # the whole first turn is shared
    assert second["usage"]["prompt_tokens"] == len(prompt2)
    assert min(keep, kv_len) <= _cached(second) <= keep  # only what the session lacked ran
    assert len(prompt2) - _cached(second) < len(prompt2) - prompt1 + 8


def test_an_edited_conversation_rewinds_the_session(server, engine):
    turn1 = [SYSTEM, {"role": "user", "content": "Sort a list."}]
    edited = [SYSTEM, {"role": "user", "content": "Sort a dict by value."}]
    with server.client() as http:
        _chat(http, turn1, "conv-edit")
        before, _ = _session_state(server, "conv-edit")
        again = _chat(http, edited, "conv-edit").json()
    assert again["choices"][0]["message"]["content"] == _solo(engine, edited, 8)
    prompt = engine.encode_request(GenerateRequest(messages=_messages(edited)))
    after, _ = _session_state(server, "conv-edit")
    assert after[: len(prompt)] == prompt  # the old turn was rewound, not kept
    assert 0 < _cached(again) <= common_prefix_len(before, prompt, len(prompt))


def test_streamed_turns_echo_the_header_and_report_cached_tokens(server, engine):
    turns = [{"role": "user", "content": "def add(a, b):"}]
    body = {"messages": turns, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}, **GREEDY}
    with server.client() as http:
        for _ in range(2):
            with http.stream("POST", "/v1/chat/completions", json=body,
                             headers={"X-Session-Id": "conv-stream"}) as response:
                assert response.headers["x-session-id"] == "conv-stream"
                events = list(sse_events(response.iter_lines()))
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                       if isinstance(e, dict) and e["choices"])
        usage = events[-2]["usage"]
        assert text == _solo(engine, turns, 6)
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert http.delete("/v1/sessions/conv-stream").json()["deleted"] == "conv-stream"
        gone = http.delete("/v1/sessions/conv-stream")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"
        too_long = http.post("/v1/chat/completions", headers={"X-Session-Id": "x" * 129},
                             json={"messages": turns, "max_tokens": 1})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["param"] == "X-Session-Id"


def test_a_session_answers_one_turn_at_a_time(slow_server):
    engine = slow_server.ctx.models.current.engine
    im_end = engine.tokenizer.token_to_id("<|im_end|>")
    bias = {"0": -100, str(im_end): -100}
    turns = [{"role": "user", "content": "Count."}]
    with slow_server.client() as http, slow_server.client() as other:
        with http.stream("POST", "/v1/chat/completions", headers={"X-Session-Id": "busy"},
                         json={"messages": turns, "max_tokens": 200, "stream": True,
                               "temperature": 0, "logit_bias": bias}) as response:
            lines = response.iter_lines()
            next(line for line in lines if '"content":"' in line and '"content":""' not in line)
            busy = other.post("/v1/chat/completions", headers={"X-Session-Id": "busy"},
                              json={"messages": turns, "max_tokens": 1})
        assert busy.status_code == 409, busy.text
        assert busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "session_busy"
        slow_server.wait_idle()
        assert other.delete("/v1/sessions/busy").status_code == 200


def test_registry_caps_sessions_and_closes_idle_ones(engine):
    now = [0.0]
    registry = SessionRegistry(idle_timeout_s=10, max_sessions=2, clock=lambda: now[0])
    open_before = len(engine.sessions)
    a = registry.acquire(engine, "a")
    registry.release(engine, a)
    now[0] = 1.0
    b = registry.acquire(engine, "b")
    with pytest.raises(ApiError) as info:
        registry.acquire(engine, "b")
    assert info.value.status == 409
    now[0] = 2.0
    c = registry.acquire(engine, "c")  # the cap closes "a", the least recently used idle one
    assert registry.names(engine) == ["b", "c"] and a.session_id not in engine.sessions
    with pytest.raises(ApiError) as full:
        registry.acquire(engine, "d")  # "b" and "c" are both answering
    assert full.value.status == 429
    registry.release(engine, b)
    registry.release(engine, c)
    now[0] = 100.0
    assert registry.sweep(engine) == 2 and registry.count(engine) == 0
    e = registry.acquire(engine, "e")
    assert registry.close(engine, "e") and e.session_id in engine.sessions  # still answering
    registry.release(engine, e)
    assert e.session_id not in engine.sessions and not registry.close(engine, "e")
    assert len(engine.sessions) == open_before
