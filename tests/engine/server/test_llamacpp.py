"""The llama.cpp routes: /infill and its fields, /completion, /props, /tokenize & co."""

from __future__ import annotations

import re

import pytest

from engine import Engine, GenerateOptions
from engine.server.infill import build_infill
from engine.text.fim import FimFile
from tests.engine.server.live import LiveServer, llama_vim_accepts, sse_events

PREFIX, SUFFIX = "def list_py_files(root):\n", "\n    return result\n"
GREEDY = {"temperature": 0, "samplers": ["temperature"], "logit_bias": [[0, False]]}


def _infill(server: LiveServer, **body):
    with server.client() as http:
        return http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                          **body})


def test_answers_are_compact_json_llama_vim_accepts(server):
    response = _infill(server, n_predict=8)
    assert response.status_code == 200
    assert llama_vim_accepts(response.text)
    assert ": " not in response.text.replace(response.json()["content"], "")


def test_response_fields_keep_slash_paths_literal(server):
    fields = ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "nothing/here"]
    body = _infill(server, n_predict=6, response_fields=fields, **GREEDY).json()
    assert set(body) == {"content", "timings/prompt_n", "timings/predicted_n", "truncated"}
    assert body["timings/predicted_n"] == 6 and body["timings/prompt_n"] > 0


def test_infill_is_the_engine_fim_layout_with_typed_text_after_the_middle(server, engine):
    extra = [{"text": "def helper():\n    pass\n", "filename": "src/util.py"}]
    body = _infill(server, input_extra=extra, prompt="    result = [", n_predict=10,
                   **GREEDY).json()
    options = GenerateOptions(max_new_tokens=10, temperature=0.0, logit_bias={0: -100.0})
    fitted = build_infill(engine, PREFIX, SUFFIX, "    result = [",
                          [FimFile("src/util.py", extra[0]["text"])], options)
    ids = fitted.request.token_ids or ()
    sep = engine.tokenizer.token_to_id("<|file_sep|>")
    assert sep in ids  # repo-level layout: the extra file comes with a file separator
    assert body["tokens_evaluated"] == len(ids)
    assert body["content"] == engine.generate(fitted.request).text
    assert body["stop_type"] == "limit" and body["truncated"] is False


def test_n_cmpl_returns_an_array(server):
    answers = _infill(server, n_predict=5, n_cmpl=3, seed=11).json()
    assert isinstance(answers, list) and len(answers) == 3
    assert all("content" in a for a in answers)
    assert [a["index"] for a in answers] == [0, 1, 2]


def test_n_predict_zero_answers_without_generating_then_warms_the_prefix_cache(server):
    server.wait_idle()
    extra = [{"text": "".join(f"warm_{i} = {i}\n" for i in range(12)), "filename": "w.py"}]
    response = _infill(server, input_extra=extra, n_predict=0, response_fields=[""])
    assert response.status_code == 200 and response.json() == {}  # nothing generated
    server.wait_idle()
    warm = server.ctx.worker.history[-1]
    assert warm.priority == "low" and warm.error is None
    body = _infill(server, input_extra=extra, n_predict=4, **GREEDY).json()
    assert body["tokens_cached"] >= 32  # the extra file's KV was ready


def test_stop_strings_end_the_answer_as_a_word_stop(server, engine):
    full = _infill(server, n_predict=30, **GREEDY).json()["content"]
    stop = full[3:5]
    body = _infill(server, n_predict=30, stop=[stop], **GREEDY).json()
    assert body["content"] == full[: full.index(stop)]
    assert body["stop_type"] == "word" and body["stopping_word"] == stop


def test_n_indent_cuts_at_the_first_under_indented_line(server):
    for seed in range(6):
        body = _infill(server, n_predict=120, n_indent=2, seed=seed, temperature=1.5,
                       samplers=["temperature"], logit_bias=[[0, False]]).json()
        lines = body["content"].split("\n")
        for line in lines[1:]:
            if line.strip():
                indent = len(line) - len(line.lstrip(" \t"))
                assert indent >= 2, body["content"]
        if body["limit"] == "n_indent":
            assert body["stop_type"] == "limit"
            return
    pytest.fail("no answer reached an under-indented line")


def test_truncation_drops_extra_files_then_the_prefix_start(server, engine):
    long_prefix = "".join(f"x{i} = {i}\n" for i in range(200))
    extra = [{"text": "y = 1\n" * 40, "filename": "big.py"}]
    body = _infill(server, input_prefix=long_prefix, input_extra=extra, n_predict=16,
                   **GREEDY).json()
    assert body["truncated"] is True and body["tokens_dropped"] > 0
    assert body["tokens_evaluated"] <= engine.context_length - 16
    assert body["tokens_predicted"] == 16


def test_time_budget_for_prediction_stops_at_a_line_break(slow_server):
    sampling = {"temperature": 1.5, "samplers": ["temperature"], "logit_bias": [[0, False]],
                "ignore_eos": True}
    with slow_server.client() as http:
        for seed in range(8):
            body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 120,
                    "return_tokens": True, "seed": seed, **sampling}
            full = http.post("/infill", json=body).json()
            if "\n" in full["content"][:-1]:  # a line to end before the last token
                break
        else:
            pytest.fail("no answer wrote a line break")
        cut = http.post("/infill", json={**body, "t_max_predict_ms": 1}).json()
        pieces = [http.post("/detokenize", json={"tokens": [t]}).json()["content"]
                  for t in cut["tokens"]]
    assert cut["stop_type"] == "limit" and cut["limit"] == "t_max_predict_ms"
    # llama.cpp's rule: past the budget, the first token that holds a line break ends it
    assert "\n" in pieces[-1] and all("\n" not in piece for piece in pieces[1:-1])
    assert full["content"].startswith(cut["content"]) and cut["content"] != full["content"]


def test_time_budget_for_the_prompt_is_not_a_cut(slow_server):
    """llama.vim sends t_max_prompt_ms: 500; llama.cpp does not enforce it, so a slow
    cold prefill still gives the whole suggestion."""
    prompt = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
    with slow_server.client() as http:
        body = http.post("/completion", json={"prompt": prompt, "n_predict": 20,
                                              "t_max_prompt_ms": 1, "ignore_eos": True,
                                              **GREEDY}).json()
    assert body["limit"] == "n_predict" and body["tokens_predicted"] == 20
    assert body["content"] and body["generation_settings"]["t_max_prompt_ms"] == 1


def test_prompt_n_counts_only_the_tokens_processed(server):
    prefix = "".join(f"value_{i} = compute({i})\n" for i in range(30)) + "def main():\n"
    body = {"input_prefix": prefix, "input_suffix": SUFFIX, "n_predict": 4, **GREEDY}
    cold = _infill(server, **body).json()
    warm = _infill(server, **body).json()
    assert cold["tokens_cached"] <= 2  # a new prompt: at most its first special tokens
    assert cold["timings"]["cache_n"] == cold["tokens_cached"]
    assert cold["timings"]["prompt_n"] == cold["tokens_evaluated"] - cold["tokens_cached"]
    assert warm["tokens_evaluated"] == cold["tokens_evaluated"]
    assert warm["tokens_cached"] > cold["tokens_evaluated"] // 2
    assert warm["timings"]["prompt_n"] == warm["tokens_evaluated"] - warm["tokens_cached"]
    assert warm["timings"]["cache_n"] == warm["tokens_cached"]
    assert warm["content"] == cold["content"]


def test_return_tokens_fills_tokens(server, engine):
    body = _infill(server, n_predict=5, return_tokens=True, **GREEDY).json()
    assert len(body["tokens"]) == 5 and engine.tokenizer.decode(body["tokens"]) == \
        body["content"]
    assert _infill(server, n_predict=5, **GREEDY).json()["tokens"] == []


def test_completion_streams_content_and_stop(server, engine):
    with server.client() as http, http.stream(
            "POST", "/completion", json={"prompt": "import sys\n", "n_predict": 12,
                                         "stream": True, **GREEDY}) as response:
        events = list(sse_events(response.iter_lines()))
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    text = "".join(e["content"] for e in events)
    options = GenerateOptions(max_new_tokens=12, temperature=0.0, logit_bias={0: -100.0})
    from engine import GenerateRequest

    assert text == engine.generate(GenerateRequest(prompt="import sys\n", options=options)).text
    assert events[-1]["timings"]["predicted_n"] == 12


def test_props_tokenize_detokenize_apply_template(server, engine: Engine):
    with server.client() as http:
        props = http.get("/props").json()
        assert props["default_generation_settings"]["n_ctx"] == engine.context_length
        kernels = props["engine_kernels"]  # the engine's own attention kernel, or why not
        assert kernels == engine.describe()["engine_kernels"]
        assert kernels["attention_nodes"] == 2
        assert kernels["moved"] == (2 if kernels["ready"] else 0)
        assert kernels["summary"].startswith(f"{kernels['moved']} of 2 GroupQueryAttention")
        tokens = http.post("/tokenize", json={"content": "<|fim_prefix|>def f"}).json()["tokens"]
        assert tokens == engine.tokenizer.encode("<|fim_prefix|>def f", parse_special=True)
        plain = http.post("/tokenize", json={"content": "<|fim_prefix|>",
                                             "parse_special": False}).json()["tokens"]
        assert len(plain) > 1
        pieces = http.post("/tokenize", json={"content": "def f", "with_pieces": True}).json()
        assert "".join(p["piece"] for p in pieces["tokens"]) == "def f"
        text = http.post("/detokenize", json={"tokens": tokens}).json()["content"]
        assert text == "<|fim_prefix|>def f"
        assert http.post("/detokenize", json={"tokens": [10**6]}).status_code == 400
        prompt = http.post("/apply-template", json={"messages": [{"role": "user",
                                                                  "content": "hi"}]}).json()
        assert prompt["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_model_without_fim_tokens_completes_from_the_prefix(nofim_server):
    response = _infill(nofim_server, n_predict=4, prompt="    result = [")
    assert response.status_code == 200 and llama_vim_accepts(response.text)
    assert "\n" not in response.json()["content"]  # mid-line: one line at most
    with nofim_server.client() as http:
        props = http.get("/props").json()
    assert props["fim_layout"] == "prefix-only" and props["fim_family"] is None
    assert llama_vim_accepts('{"content":""}')  # sanity of the helper itself


def test_infill_takes_a_gbnf_grammar(server):
    body = _infill(server, n_predict=8, grammar='root ::= "x" [0-9] "\\n"').json()
    assert re.fullmatch(r"x[0-9]\n", body["content"]) and body["stop_type"] == "eos"
