"""The forge builds models that look like the real exports and behave like one model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.forge import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    ForgeSpec,
    load_tokenizer,
    make_weights,
    og_greedy,
    quantize_int4,
    reference_greedy,
    reference_logits,
    write_optimum_model,
)
from tests.peers import onnxruntime_genai

PROMPT = [10, 20, 30, 40, 50, 60, 70]
STEPS = 32


# ---- helpers -------------------------------------------------------------------------------


def _signature(path: Path) -> list[tuple[str, str, int, list[str]]]:
    """(kind, name, dtype, dims) where dims are the symbolic names or 'int'."""
    graph = onnx.load(str(path), load_external_data=False).graph
    rows = []
    for kind, values in (("in", graph.input), ("out", graph.output)):
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param if d.dim_param else "int" for d in t.shape.dim]
            rows.append((kind, v.name, t.elem_type, dims))
    return rows


def _session(model_dir: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(model_dir / "model.onnx"), opts, providers=["CPUExecutionProvider"]
    )


def _kv_names(sess: ort.InferenceSession) -> list[tuple[str, str]]:
    pasts = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    return [(p, p.replace("past_key_values.", "present.")) for p in pasts]


def shared_buffer_greedy(
    model_dir: Path,
    spec: ForgeSpec,
    prompt: list[int],
    n: int,
    *,
    max_len: int,
    mask_extra: int = 0,
    zero_past: bool = False,
) -> list[int]:
    """Greedy decode of a genai-layout model with ONE KV buffer bound as past and present.

    ``mask_extra`` lengthens the mask (a deliberate off-by-one); ``zero_past`` wipes the
    cache after every step (a deliberately lost KV).
    """
    sess = _session(model_dir)
    buffers = {
        p: np.zeros((1, spec.kv_heads, max_len, spec.hd), np.float32) for p, _ in _kv_names(sess)
    }
    values = {p: ort.OrtValue.ortvalue_from_numpy(b) for p, b in buffers.items()}
    binding = sess.io_binding()
    feed, past, out = list(prompt), 0, []
    for _ in range(n):
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        total = past + len(feed)
        binding.bind_cpu_input("input_ids", np.array([feed], np.int64))
        binding.bind_cpu_input("attention_mask", np.ones((1, total + mask_extra), np.int64))
        binding.bind_output("logits")  # first, so copy_outputs_to_cpu()[0] is the logits
        for p, present in _kv_names(sess):
            binding.bind_ortvalue_input(p, values[p])
            binding.bind_ortvalue_output(present, values[p])
        sess.run_with_iobinding(binding)
        token = int(np.argmax(binding.copy_outputs_to_cpu()[0][0, -1]))
        out.append(token)
        if zero_past:
            for b in buffers.values():
                b[...] = 0.0
        feed, past = [token], total
    return out


def static_inplace_greedy(model_dir: Path, spec: ForgeSpec, prompt: list[int], n: int) -> list[int]:
    """Greedy decode of the static layout: present bound to the past buffer, mask of max_len."""
    sess = _session(model_dir)
    max_len = sess.get_inputs()[2].shape[1]
    values = {
        p: ort.OrtValue.ortvalue_from_numpy(
            np.zeros((1, spec.kv_heads, max_len, spec.hd), np.float32)
        )
        for p, _ in _kv_names(sess)
    }
    mask = np.zeros((1, max_len), np.int64)
    binding = sess.io_binding()
    feed, past, out = list(prompt), 0, []
    for _ in range(n):
        total = past + len(feed)
        mask[0, past:total] = 1
        binding.bind_cpu_input("input_ids", np.array([feed], np.int64))
        binding.bind_cpu_input("position_ids", np.arange(past, total, dtype=np.int64)[None])
        binding.bind_cpu_input("attention_mask", mask)
        binding.bind_output("logits")  # first, so copy_outputs_to_cpu()[0] is the logits
        for p, present in _kv_names(sess):
            binding.bind_ortvalue_input(p, values[p])
            binding.bind_ortvalue_output(present, values[p])
        sess.run_with_iobinding(binding)
        token = int(np.argmax(binding.copy_outputs_to_cpu()[0][0, -1]))
        out.append(token)
        feed, past = [token], total
    return out


def optimum_growing_greedy(
    model_dir: Path, spec: ForgeSpec, prompt: list[int], n: int, *, decode_offset: int = 0
) -> list[int]:
    """Greedy decode of the optimum layout feeding present back as past (numpy feeds).

    ``decode_offset`` shifts the position ids of decode steps (a deliberate RoPE mistake).
    """
    sess = _session(model_dir)
    kv = {p: np.zeros((1, spec.kv_heads, 0, spec.hd), np.float32) for p, _ in _kv_names(sess)}
    feed, past, out = list(prompt), 0, []
    for _ in range(n):
        total = past + len(feed)
        feeds = {
            "input_ids": np.array([feed], np.int64),
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.arange(past, total, dtype=np.int64)[None]
            + (decode_offset if past else 0),
            **kv,
        }
        results = sess.run(None, feeds)
        names = [o.name for o in sess.get_outputs()]
        token = int(np.argmax(results[0][0, -1]))
        out.append(token)
        kv = {p: results[names.index(present)] for p, present in _kv_names(sess)}
        feed, past = [token], total
    return out


# ---- tokenizer -----------------------------------------------------------------------------


def test_tokenizer_special_tokens_and_round_trip(tokenizer_dir: Path) -> None:
    tok = load_tokenizer(tokenizer_dir)
    assert tok.get_vocab_size() == 512
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    text = "def f(x):\n    return x  # héllo, 日本語 🎉\n\t<|im_start|>user\n"
    ids = tok.encode(text).ids
    assert tok.token_to_id("<|im_start|>") in ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>"
    assert config["added_tokens_decoder"]["8"]["content"] == "<|repo_name|>"
    assert config["chat_template"] == (tokenizer_dir / "chat_template.jinja").read_text()


def test_chat_template_matches_reference(reference_models_dir: Path) -> None:
    reference = (reference_models_dir / "tiny-genai-fp32" / "chat_template.jinja").read_text()
    assert reference == CHAT_TEMPLATE


# ---- interface -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "reference"),
    [("genai_model_dir", "tiny-genai-fp32"), ("optimum_model_dir", "tiny-optimum")],
)
def test_io_signature_matches_real_exports(
    request: pytest.FixtureRequest, reference_models_dir: Path, fixture: str, reference: str
) -> None:
    forged = request.getfixturevalue(fixture) / "model.onnx"
    assert _signature(forged) == _signature(reference_models_dir / reference / "model.onnx")


def test_genai_files_and_pruned_logits(genai_model_dir: Path, genai_pruned_model_dir: Path) -> None:
    assert (genai_model_dir / "model.onnx.data").is_file()
    config = json.loads((genai_model_dir / "genai_config.json").read_text())
    assert config["model"]["decoder"]["head_size"] == ForgeSpec().hd
    assert config["search"]["past_present_share_buffer"] is True
    assert reference_logits(genai_model_dir, PROMPT).shape == (len(PROMPT), 512)
    pruned = reference_logits(genai_pruned_model_dir, PROMPT)
    assert pruned.shape == (1, 512)
    np.testing.assert_allclose(pruned[0], reference_logits(genai_model_dir, PROMPT)[-1], atol=1e-4)


# ---- oracles -------------------------------------------------------------------------------


def test_reference_loop_reproduces_onnxruntime_genai(reference_models_dir: Path) -> None:
    expected = json.loads((reference_models_dir / "expected-onnxruntime-genai.json").read_text())
    for case in expected["models"]["tiny-genai-fp32"]:
        want = case["greedy_new_tokens"][:48]
        for model in ("tiny-genai-fp32", "tiny-optimum"):
            got = reference_greedy(
                reference_models_dir / model, case["prompt_token_ids"], len(want)
            )
            assert got == want, model


def test_onnxruntime_genai_runs_forged_model(
    genai_model_dir: Path, genai_pruned_model_dir: Path
) -> None:
    want = reference_greedy(genai_model_dir, PROMPT, STEPS)
    assert og_greedy(genai_model_dir, PROMPT, STEPS) == want
    assert og_greedy(genai_pruned_model_dir, PROMPT, STEPS) == want


# ---- one model, three layouts, several decode loops ----------------------------------------


def test_layouts_agree(
    genai_model_dir: Path, optimum_model_dir: Path, static_model_dir: Path, forge_spec: ForgeSpec
) -> None:
    want = reference_greedy(genai_model_dir, PROMPT, STEPS)
    assert reference_greedy(optimum_model_dir, PROMPT, STEPS) == want
    assert reference_greedy(static_model_dir, PROMPT, STEPS) == want
    assert shared_buffer_greedy(genai_model_dir, forge_spec, PROMPT, STEPS, max_len=64) == want
    assert static_inplace_greedy(static_model_dir, forge_spec, PROMPT, STEPS) == want
    assert optimum_growing_greedy(optimum_model_dir, forge_spec, PROMPT, STEPS) == want


def test_shared_buffer_up_to_context(genai_model_dir: Path, forge_spec: ForgeSpec) -> None:
    """MAX = the model's whole context (the cos/sin cache length) works too."""
    got = shared_buffer_greedy(genai_model_dir, forge_spec, PROMPT, 8, max_len=forge_spec.context)
    assert got == reference_greedy(genai_model_dir, PROMPT, 8)


# ---- sharpness -----------------------------------------------------------------------------


def test_sharp_weights_expose_mistakes(
    genai_model_dir: Path, optimum_model_dir: Path, forge_spec: ForgeSpec
) -> None:
    want = reference_greedy(genai_model_dir, PROMPT, STEPS)
    assert len(set(want)) >= 8, f"degenerate continuation: {want}"
    off_by_one = shared_buffer_greedy(
        genai_model_dir, forge_spec, PROMPT, STEPS, max_len=64, mask_extra=1
    )
    lost_kv = shared_buffer_greedy(
        genai_model_dir, forge_spec, PROMPT, STEPS, max_len=64, zero_past=True
    )
    assert off_by_one != want
    assert lost_kv != want
    # RoPE is relative: shifting every position changes nothing, but a decode step whose
    # position is off by one (a gap after the prompt) must change the tokens.
    gap = optimum_growing_greedy(optimum_model_dir, forge_spec, PROMPT, STEPS, decode_offset=1)
    assert gap != want


def test_deep_weights_give_sane_logits(tmp_path: Path) -> None:
    spec = ForgeSpec(layers=12, hidden=96, heads=6, kv_heads=2, intermediate=192, vocab=600)
    model_dir = write_optimum_model(tmp_path, spec, tokenizer_vocab=512)
    logits = reference_logits(model_dir, list(range(100, 140)))
    assert np.isfinite(logits).all()
    assert 0.5 < float(logits.std(axis=-1).mean()) < 20.0
    assert len(set(logits.argmax(-1).tolist())) > 10


def test_weights_are_deterministic() -> None:
    a, b = make_weights(ForgeSpec()), make_weights(ForgeSpec())
    c = make_weights(ForgeSpec(seed=1))
    np.testing.assert_array_equal(a.layers[1].q_w, b.layers[1].q_w)
    assert not np.array_equal(a.layers[1].q_w, c.layers[1].q_w)


# ---- int4 ----------------------------------------------------------------------------------


def test_quantize_int4_runs_in_both_runtimes(genai_model_dir: Path, tmp_path: Path) -> None:
    q_dir = quantize_int4(genai_model_dir, tmp_path / "q4")
    graph = onnx.load(str(q_dir / "model.onnx"), load_external_data=False).graph
    assert not [n for n in graph.node if n.op_type == "MatMul"]
    assert len([n for n in graph.node if n.op_type == "MatMulNBits"]) == 1 + 5 * ForgeSpec().layers
    assert (q_dir / "tokenizer.json").is_file() and (q_dir / "genai_config.json").is_file()
    fp32 = reference_logits(genai_model_dir, PROMPT)
    int4 = reference_logits(q_dir, PROMPT)
    assert np.corrcoef(fp32.ravel(), int4.ravel())[0, 1] > 0.9
    assert og_greedy(q_dir, PROMPT, 8) == reference_greedy(q_dir, PROMPT, 8)


def test_onnxruntime_genai_tokenizer_agrees(genai_model_dir: Path) -> None:
    og = onnxruntime_genai()
    og_tok = og.Tokenizer(og.Model(str(genai_model_dir)))
    tok = load_tokenizer(genai_model_dir)
    for text in ("def f(n):\n    return n  # é 日本 🎉", "<|im_start|>user\nhi<|im_end|>\n"):
        assert [int(t) for t in og_tok.encode(text)] == tok.encode(text).ids
