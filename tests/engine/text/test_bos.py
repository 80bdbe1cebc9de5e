"""Raw prompts start with BOS when the model's tokenizer adds one by default, token for
token as onnxruntime-genai 0.18 tokenizes them; chat templates and FIM keep their rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.text.tokenizer import ChatMessage
from tests.forge import ForgeSpec, write_genai_model
from tests.peers import REASON

og = pytest.importorskip("onnxruntime_genai", reason=REASON)

BOS = "<|endoftext|>"  # the forge's id 0: GPT-2 style, its own BOS
PROMPTS = ["def f(x):\n    return x", "héllo wörld  ", "<|im_start|>user\nhi", " x", ""]


def _bos_model(folder: Path) -> Path:
    """A forged onnxruntime-genai model whose tokenizer prepends BOS (post-processor and
    ``add_bos_token``, as Llama/Gemma/Phi-3 tokenizers do)."""
    write_genai_model(folder, ForgeSpec())
    data = json.loads((folder / "tokenizer.json").read_text())
    first = [{"SpecialToken": {"id": BOS, "type_id": 0}}]
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [*first, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [*first, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}}}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, bos_token=BOS)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def bos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bos_model(tmp_path_factory.mktemp("bos") / "bos-model")


@pytest.fixture(scope="module")
def bos_engine(bos_dir: Path) -> Engine:
    return Engine.load(bos_dir, EngineConfig(intra_op_threads=1))


def test_raw_prompts_equal_onnxruntime_genai_tokens(bos_dir: Path, bos_engine: Engine):
    reference = og.Tokenizer(og.Model(str(bos_dir)))
    reference.update_options(add_special_tokens="true")  # what generation feeds the model
    assert bos_engine.tokenizer.adds_bos_by_default
    for prompt in PROMPTS:
        expected = [int(t) for t in reference.encode(prompt)]
        assert expected[:1] == [0]
        ours = bos_engine.encode_request(GenerateRequest(prompt=prompt))
        assert ours == expected, prompt


def test_a_prompt_that_starts_with_bos_gets_it_once(bos_engine: Engine):
    ids = bos_engine.encode_request(GenerateRequest(prompt=BOS + "import os"))
    assert ids.count(0) == 1 and ids[0] == 0


def test_token_prompts_chat_and_fim_keep_their_rule(bos_engine: Engine, tmp_path: Path):
    assert bos_engine.encode_request(GenerateRequest(token_ids=(5, 6))) == [5, 6]
    chat = bos_engine.encode_request(GenerateRequest(messages=(ChatMessage("user", "hi"),)))
    # the template decides (this one writes no BOS), not the tokenizer's post-processor
    assert chat == bos_engine.tokenizer.encode_chat([ChatMessage("user", "hi")],
                                                    add_generation_prompt=True)
    assert chat[0] != 0
    plain = write_genai_model(tmp_path / "plain", ForgeSpec())  # no BOS: nothing added
    engine = Engine.load(plain, EngineConfig(intra_op_threads=1))
    assert engine.encode_request(GenerateRequest(prompt="import os"))[0] != 0


def test_generation_sees_the_bos_prompt(bos_engine: Engine):
    options = GenerateOptions(max_new_tokens=3, temperature=0.0)
    result = bos_engine.generate(GenerateRequest(prompt="import os", options=options))
    assert result.prompt_tokens == len(bos_engine.tokenizer.encode("import os")) + 1
