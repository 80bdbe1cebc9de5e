"""The shipped default model (resources/models/default-coder): found by the engine, loads in
onnxruntime-genai with the same greedy tokens, completes code, fills in the middle, chats.

Loads the committed ONNX folder only: no PyTorch needed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import engine.default_model as default_model
from engine import ChatMessage, Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.__main__ import main as engine_main
from engine.default_model import default_model_dir
from tests.forge.reference_loop import og_greedy

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "resources" / "models" / "default-coder"
MODEL = default_model_dir()
needs_model = pytest.mark.skipif(MODEL is None, reason="resources/models/default-coder absent")
GREEDY = GenerateOptions(max_new_tokens=32, temperature=0.0)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    assert MODEL is not None
    loaded = Engine.load(MODEL, EngineConfig(intra_op_threads=1))
    yield loaded
    loaded.close()


def test_default_model_dir_is_the_source_tree_folder() -> None:
    assert MODEL is None or MODEL == SHIPPED


def test_default_model_dir_prefers_the_frozen_bundle(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    folder = tmp_path / "resources" / "models" / "default-coder"
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text("{}")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert default_model_dir() == folder


def test_default_model_dir_is_none_without_genai_config(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    (tmp_path / "default-coder").mkdir()
    monkeypatch.setattr(default_model, "_candidates", lambda: [tmp_path / "default-coder"])
    assert default_model_dir() is None


@needs_model
def test_folder_is_small_and_documented() -> None:
    assert MODEL is not None
    size = sum(p.stat().st_size for p in MODEL.rglob("*") if p.is_file())
    assert size <= 25 * 1024 * 1024
    card = (MODEL / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "PSF" in card and "Licence" in card
    for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (MODEL / name).is_file()


def _prompts(engine: Engine) -> dict[str, list[int]]:
    fim = engine.fim_request("def area(r):\n    return ", "\n\nprint(area(2))\n")
    assert fim.token_ids is not None
    chat = engine.tokenizer.encode_chat([ChatMessage("user", "Write a function that adds.")])
    return {"code": engine.tokenizer.encode("import os\n\ndef main(argv):\n"),
            "fim": list(fim.token_ids), "chat": chat}


@needs_model
def test_onnxruntime_genai_gives_the_engines_greedy_tokens(engine: Engine) -> None:
    pytest.importorskip("onnxruntime_genai")
    assert MODEL is not None
    n = 24
    for name, ids in _prompts(engine).items():
        # og_greedy runs to min_length = max_length, which masks EOS: do the same here
        options = GenerateOptions(max_new_tokens=n, temperature=0.0, min_new_tokens=n)
        ours = engine.generate(GenerateRequest(token_ids=tuple(ids), options=options))
        assert list(ours.token_ids) == og_greedy(MODEL, ids, n), name


@needs_model
def test_fim_completes_a_range_call(engine: Engine) -> None:
    # suffix-prefix-middle: this tiny model continues the prefix only in that order (in the
    # default prefix-suffix-middle order it mostly starts a new line; see MODEL_CARD.md)
    options = GenerateOptions(max_new_tokens=16, temperature=0.0, stop_sequences=("\n",))
    for suffix in ("", "\n    print(i)\n"):
        request = engine.fim_request("for i in range(", suffix, options, order="spm")
        text = engine.generate(request).text
        assert text.strip() and ")" in text, repr(text)


@needs_model
def test_fim_in_prefix_suffix_middle_order_gives_an_answer(engine: Engine) -> None:
    options = GenerateOptions(max_new_tokens=16, temperature=0.0)
    request = engine.fim_request("def area(r):\n", "\n\nprint(area(2))\n", options,
                                 order="psm")
    result = engine.generate(request)
    assert result.token_ids and result.text.strip()


@needs_model
def test_chat_answers(engine: Engine) -> None:
    request = GenerateRequest(
        messages=(ChatMessage("user", "Write a Python function `square(x)`: Return x squared."),),
        options=GenerateOptions(max_new_tokens=48, temperature=0.0))
    result = engine.generate(request)
    assert result.text.strip()


@needs_model
def test_cli_generate_prints_python(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--model", str(MODEL), "--prompt", "def fib(n):",
            "--max-new-tokens", "48", "--threads", "1"]
    assert engine_main(argv) == 0
    out = capsys.readouterr().out
    assert out.strip()
    assert any(word in out for word in ("return", "if ", "=", "("))


def test_the_models_declared_fim_order_is_what_requests_get(engine: Engine) -> None:
    """tokenizer_config.json says ``fim_order: spm``: an editor's /infill (no order given)
    gets the order this model completes best in, so `range(` is continued in place."""
    assert engine.tokenizer.fim_order == "spm"
    options = GenerateOptions(max_new_tokens=12, temperature=0.0)
    default = engine.fim_request("for i in range(", "\n    print(i)\n", options)
    spm = engine.fim_request("for i in range(", "\n    print(i)\n", options, order="spm")
    assert default.token_ids == spm.token_ids
    text = engine.generate(default).text
    assert ")" in text.split("\n")[0]
