"""Code completion on a model without FIM tokens, as the editors ask for it: llama.cpp's
/infill (llama.vim, llama.vscode, the app's Code pane), OpenAI /v1/completions with
``suffix`` (Tabby, Continue) and Ollama /api/generate with ``suffix`` (Continue).

The worker serves a forged model without FIM tokens whose logits follow a script
(tests/engine/scripted_model.py), so each test knows what the model wants at each step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.scripted_model import FIRST, SECOND, Scenario, write_scripted_model
from tests.engine.server.live import LiveServer, llama_vim_accepts, serve, sse_events

SCENARIOS = {
    # mid-line: the model wants to close the bracket the suffix closes, then closes it
    "mid_line": Scenario("import os\n\n\ndef f(a, b):\n    x = foo(", ")\n    return x\n",
                         ({")": FIRST, "a": SECOND}, ",", " b", ")", "\n")),
    # the cursor on a new line: the model's first choice is another line break
    "newline_first": Scenario("import os\n", "\nprint(x)\n",
                              ("\n", {"\n": FIRST, "x": SECOND}, " =", " ", "1", "\n",
                               "\n")),
    # (a line-start cursor's line break is healed: the first token spells it again)
    "dedent": Scenario("def area(r):\n", "\n", ("\n", "   ", " return", " a", "\n", "x",
                                                 " =")),
    # Tabby's and Continue's request: after "return " (the blank is healed)
    "healed": Scenario("def area(r):\n    return ", "\n\nprint(area(2))\n",
                       ({"x": FIRST, " a": SECOND}, "\n", "\n", "x")),
}
GREEDY = {"temperature": 0, "n_predict": 24}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[LiveServer, dict[str, Scenario]]]:
    folder: Path = tmp_path_factory.mktemp("scripted-server") / "plain-coder"
    placed = write_scripted_model(folder, list(SCENARIOS.values()))
    live = serve(folder)
    yield live, dict(zip(SCENARIOS, placed, strict=True))
    live.stop()


def _infill_body(scenario: Scenario, **fields: object) -> dict[str, object]:
    """Laid out as llama.vim and the Code pane send it: the lines above, the typed part of
    the cursor's line, the rest."""
    above, _, typed = scenario.prefix.rpartition("\n")
    return {"input_prefix": above + "\n" if above else "", "prompt": typed,
            "input_suffix": scenario.suffix, **GREEDY, **fields}


def test_infill_answers_one_line_without_what_the_suffix_has(scripted):
    live, scenarios = scripted
    with live.client() as http:
        response = http.post("/infill", json=_infill_body(scenarios["mid_line"]))
    assert response.status_code == 200 and llama_vim_accepts(response.text)
    body = response.json()
    assert body["content"] == "a, b"
    assert body["stop_type"] == "eos" and body["fim_stop"] == "suffix_bracket"


def test_infill_never_answers_an_empty_line_for_a_new_line(scripted):
    live, scenarios = scripted
    for lines in ("auto", "single", "multi"):
        with live.client() as http:
            body = http.post("/infill", json=_infill_body(scenarios["newline_first"],
                                                          fim_lines=lines)).json()
        assert body["content"] == "x = 1", lines


def test_infill_multi_line_stops_at_the_dedent(scripted):
    live, scenarios = scripted
    with live.client() as http:
        body = http.post("/infill", json=_infill_body(scenarios["dedent"])).json()
    assert body["content"] == "    return a" and body["fim_stop"] == "dedent"
    assert body["tokens_predicted"] == 6  # the healed line break, then up to the dedent


def test_infill_stream_never_sends_text_that_is_trimmed(scripted):
    live, scenarios = scripted
    with live.client() as http, http.stream(
            "POST", "/infill", json=_infill_body(scenarios["mid_line"], stream=True)) as reply:
        events = list(sse_events(reply.iter_lines()))
    texts = [e["content"] for e in events]
    assert "".join(texts) == "a, b" and not any(")" in t for t in texts)
    assert events[-1]["stop"] is True and events[-1]["fim_stop"] == "suffix_bracket"


def test_openai_completions_with_suffix(scripted):
    live, scenarios = scripted
    scenario = scenarios["healed"]
    body = {"model": "plain-coder", "prompt": scenario.prefix, "suffix": scenario.suffix,
            "max_tokens": 24, "temperature": 0}
    with live.client() as http:
        whole = http.post("/v1/completions", json=body).json()
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
            chunks = [e for e in sse_events(reply.iter_lines()) if e != "[DONE]"]
    choice = whole["choices"][0]
    assert choice["text"] == "a" and choice["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["text"] for c in chunks) == "a"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_ollama_generate_with_suffix_as_continue_sends_it(scripted):
    live, scenarios = scripted
    scenario = scenarios["healed"]
    with live.client() as http:
        shown = http.post("/api/show", json={"name": "plain-coder"}).json()
        assert ".Suffix" in shown["template"] and shown["fim_layout"] == "prefix-only"
        with http.stream("POST", "/api/generate", json={
                "model": "plain-coder", "prompt": scenario.prefix, "suffix": scenario.suffix,
                "raw": True, "stream": True,
                "options": {"temperature": 0.01, "top_p": 1.0, "num_predict": 24,
                            "stop": ["\n\n"]}}) as reply:
            lines = [json.loads(line) for line in reply.iter_lines() if line.strip()]
    assert "".join(line["response"] for line in lines) == "a"
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"


def test_props_and_models_say_the_layout(scripted, server):
    live, _ = scripted
    with live.client() as http:
        props = http.get("/props").json()
        card = http.get("/v1/models").json()["data"][0]
    assert props["infill"] is True and props["fim_layout"] == "prefix-only"
    assert card["meta"]["fim"] is None and card["meta"]["fim_layout"] == "prefix-only"
    with server.client() as http:  # a model with FIM tokens keeps its own
        assert http.get("/props").json()["fim_layout"] == "psm"


@pytest.mark.parametrize("name, answer", [("newline_first", "x = 1"),
                                          ("dedent", "    return a")])
def test_a_line_break_stop_ends_the_answer_not_the_healed_line_break(scripted, name, answer):
    """``"stop": ["\\n"]`` is how a client asks for one line. The cursor starts a line, so
    its line break is healed (the first generated token spells it): the stop applies to
    the answer after it, on every route that completes code."""
    live, scenarios = scripted
    scenario = scenarios[name]
    with live.client() as http:
        infill = http.post("/infill", json=_infill_body(scenario, stop=["\n"])).json()
        openai = http.post("/v1/completions", json={
            "model": "plain-coder", "prompt": scenario.prefix, "suffix": scenario.suffix,
            "max_tokens": 24, "temperature": 0, "stop": "\n"}).json()
        ollama = http.post("/api/generate", json={
            "model": "plain-coder", "prompt": scenario.prefix, "suffix": scenario.suffix,
            "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 24, "stop": ["\n"]}}).json()
        with http.stream("POST", "/infill", json=_infill_body(
                scenario, stop=["\n"], stream=True)) as reply:
            streamed = "".join(e["content"] for e in sse_events(reply.iter_lines()))
    assert infill["content"] == answer, infill
    assert streamed == answer
    assert openai["choices"][0]["text"] == answer, openai
    assert ollama["response"] == answer, ollama
