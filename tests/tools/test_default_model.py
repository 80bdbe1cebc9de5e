"""The built-in model (resources/models/smollm2-135m-instruct): found by the engine and the
app, documented and hash-checked, loads in onnxruntime-genai with the same greedy tokens,
answers a chat question correctly, and completes code without FIM tokens.

The tests that load the 86 MB model are marked ``builtin`` (``-m "not builtin"`` skips them);
they skip where the folder is absent.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import engine.model.default_model as default_model
from engine import ChatMessage, Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.model.default_model import DEFAULT_MODEL_NAME, default_model_dir
from tests.engine.equivalence import assert_follows_solo_up_to_a_near_tie
from tests.forge.reference_loop import og_greedy
from tests.peers import onnxruntime_genai

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "resources" / "models" / DEFAULT_MODEL_NAME
MODEL = default_model_dir()
needs_model = pytest.mark.skipif(MODEL is None, reason=f"{SHIPPED} absent")
builtin = [pytest.mark.builtin, needs_model]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    assert MODEL is not None
    loaded = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    yield loaded
    loaded.close()


def test_default_model_dir_is_the_source_tree_folder() -> None:
    assert MODEL is None or MODEL == SHIPPED


def test_the_app_and_the_engine_name_the_same_folder() -> None:
    from app.launch import DEFAULT_MODEL
    from app.launch import default_model as app_default

    assert DEFAULT_MODEL == DEFAULT_MODEL_NAME
    assert app_default() == MODEL


def test_default_model_dir_prefers_the_frozen_bundle(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    folder = tmp_path / "resources" / "models" / DEFAULT_MODEL_NAME
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text("{}")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert default_model_dir() == folder


def test_default_model_dir_is_none_without_genai_config(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    (tmp_path / DEFAULT_MODEL_NAME).mkdir()
    monkeypatch.setattr(default_model, "_candidates", lambda: [tmp_path / DEFAULT_MODEL_NAME])
    assert default_model_dir() is None


@needs_model
def test_every_file_matches_the_provenance_note() -> None:
    """PROVENANCE.md lists each file's size and sha256 as the import tool wrote it: a file
    changed or re-exported without the note (or the note without the file) fails here."""
    assert MODEL is not None
    note = (MODEL / "PROVENANCE.md").read_text(encoding="utf-8")
    rows = dict((name, (int(size), digest)) for name, size, digest in
                re.findall(r"^\| `([^`]+)` \| (\d+) \| `([0-9a-f]{64})` \|$", note, re.M))
    # notes, and the sampling the app recommends for it (not the import tool's output)
    documented = {"PROVENANCE.md", "MODEL_CARD.md", "eval.json", "generation_config.json"}
    on_disk = {p.name for p in MODEL.iterdir() if p.is_file()} - documented
    assert set(rows) == on_disk
    for name, (size, digest) in rows.items():
        data = (MODEL / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (size, digest), name
    assert "Apache License" in (MODEL / "LICENSE").read_text(encoding="utf-8")
    card = (MODEL / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "Apache-2.0" in card and "SmolLM2-135M-Instruct" in card


def _prompts(engine: Engine) -> dict[str, list[int]]:
    chat = engine.tokenizer.encode_chat([ChatMessage("user", "What is the capital of France?")])
    fim = engine.fim_request("import os\n\n\ndef list_python_files(folder):\n    ", "\n")
    assert fim.token_ids is not None
    return {"chat": chat, "code": engine.tokenizer.encode("def fibonacci(n):\n"),
            "fim": list(fim.token_ids)}


@pytest.mark.builtin
@needs_model
def test_onnxruntime_genai_gives_the_engines_greedy_tokens(engine: Engine) -> None:
    """With ONNX Runtime's attention kernel the engine runs og's graph and kernels: the same
    tokens. With its own (engine/kernels, the default) the attention's sums run in another
    order, and the int4 layers' int8 activations can turn a last-bit difference into a
    different token where the two best were nearly tied: the same tokens up to such a
    near-tie (tests/engine/equivalence.py)."""
    onnxruntime_genai()
    assert MODEL is not None
    plain = Engine.load(MODEL, EngineConfig(intra_op_threads=2, own_kernels=False))
    n = 24
    try:
        for name, ids in _prompts(engine).items():
            # og_greedy runs to min_length = max_length, which masks EOS: do the same here
            options = GenerateOptions(max_new_tokens=n, temperature=0.0, min_new_tokens=n,
                                      top_logprobs=5)
            theirs = og_greedy(MODEL, ids, n, threads=2)
            request = GenerateRequest(token_ids=tuple(ids), options=options)
            assert list(plain.generate(request).token_ids) == theirs, name
            ours = engine.generate(request)
            parted = assert_follows_solo_up_to_a_near_tie(ours, theirs)
            print(f"{name}: the engine's kernel and og part at token {parted}")
    finally:
        plain.close()


@pytest.mark.builtin
@needs_model
def test_chat_answers_the_question(engine: Engine) -> None:
    request = GenerateRequest(
        messages=(ChatMessage("user", "Write a Python function that reverses a string."),),
        options=GenerateOptions(max_new_tokens=96, temperature=0.0))
    text = engine.generate(request).text
    assert "def " in text and "[::-1]" in text, text


@pytest.mark.builtin
@needs_model
def test_code_completion_without_fim_tokens_gives_the_rest_of_the_line(
        engine: Engine) -> None:
    """The model has no FIM tokens: the prefix-only layout answers one non-empty line."""
    options = GenerateOptions(max_new_tokens=24, temperature=0.0)
    request = engine.fim_request("def add(a, b):\n    return ", "\n\n\nprint(add(1, 2))\n",
                                 options)
    text = engine.generate(request).text
    assert "\n" not in text.strip("\n") and "a + b" in text, repr(text)
