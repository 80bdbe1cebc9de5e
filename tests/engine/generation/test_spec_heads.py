"""Model-declared proposers (MTP, EAGLE-3, shared-KV): every contract is checked at load."""

import logging

import pytest

from engine import (
    Engine,
    EngineConfig,
    GenerateOptions,
    GenerateRequest,
    InvalidOptionError,
    ModelLoadError,
    UnsupportedModelError,
)
from tests.forge import ForgeSpec
from tests.forge.heads import write_f32, write_head, write_hidden_target

SPEC = ForgeSpec()
H, V = SPEC.hidden, SPEC.vocab
Shape = list[int | str]
KV_SHAPE: Shape = ["batch", SPEC.kv_heads, "total", SPEC.hd]
TAPS = {"hidden_states": (-1, "float32"), "h.0": (0, "float32"), "h.1": (1, "float32"),
        "hidden_f16": (-1, "float16"), "hidden_f64": (-1, "float64")}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A target exposing hidden states, with one head of every kind beside it."""
    root = write_hidden_target(tmp_path_factory.mktemp("hidden-target"), SPEC, taps=TAPS)
    bsh: Shape = ["batch", "seq", H]
    write_head(root / "mtp.onnx", {"hidden_states": bsh}, {"logits": V})
    write_head(root / "mtp_hidden.onnx", {"hidden_states": bsh},
               {"hidden_states_out": H})
    write_head(root / "mtp_narrow.onnx", {"hidden_states": ["batch", "seq", 32]}, {"logits": V})
    write_head(root / "eagle3.onnx", {"hidden_states": ["batch", "seq", 3 * H],
                                      "inputs_embeds": bsh}, {"logits": 256})
    write_head(root / "eagle3_fused2.onnx", {"hidden_states": ["batch", "seq", 2 * H],
                                             "inputs_embeds": bsh}, {"logits": 256})
    write_head(root / "eagle3_wide.onnx", {"hidden_states": ["batch", "seq", 3 * H],
                                           "inputs_embeds": bsh}, {"logits": 600})
    write_head(root / "assistant.onnx", {"inputs_embeds": bsh, "k0": KV_SHAPE, "v0": KV_SHAPE},
               {"logits": V})
    write_head(root / "assistant_small.onnx", {"inputs_embeds": bsh, "k0": KV_SHAPE,
                                               "v0": KV_SHAPE}, {"logits": 256})
    write_f32(root / "embed.f32", V, H)
    write_f32(root / "lm_head.f32", H, V)
    write_f32(root / "ragged.f32", V, H, extra_bytes=2)
    write_f32(root / "short.f32", V - 1, H)
    return root


MTP = {"type": "mtp", "model": "mtp.onnx", "hidden_size": H,
       "target_hidden_output": "hidden_states"}
EAGLE3 = {"type": "eagle3", "model": "eagle3.onnx", "hidden_size": H,
          "target_hidden_outputs": ["h.0", "h.1", "hidden_states"],
          "embedding_weights": "embed.f32", "num_speculative_tokens": 4}
GROUP = {"name": "g0", "target_layers": [0], "key_input": "k0", "value_input": "v0",
         "target_key_input": "past_key_values.0.key",
         "target_value_input": "past_key_values.0.value"}
SHARED = {"type": "shared_kv", "model": "assistant.onnx", "hidden_size": H,
          "embedding_weights": "embed.f32", "shared_kv": [GROUP]}


def _load(folder, head):
    return Engine.load(folder, EngineConfig(intra_op_threads=1, speculative_head=head))


def _greedy(engine, prompt=(5, 17, 42, 99, 7), mode="none"):
    options = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=12,
                              speculative_mode=mode)
    return engine.generate(GenerateRequest(token_ids=prompt, options=options)).token_ids


def test_a_declared_mtp_head_that_fits_loads_and_runs(tmp_path, optimum_model_dir, caplog):
    folder = write_hidden_target(tmp_path / "t", SPEC, taps=TAPS,
                                 speculative={k: v for k, v in MTP.items()
                                              if k != "target_hidden_output"})
    write_head(folder / "mtp.onnx", {"hidden_states": ["batch", "seq", H]}, {"logits": V})
    with caplog.at_level(logging.INFO, logger="engine.generation.spec_heads"):
        engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    head = engine.declared_head
    assert head is not None and head.config.kind == "mtp" and head.executable
    assert head.config.target_hidden_outputs == ("hidden_states",)  # from io.hidden_output
    assert "speculative_mode='mtp' runs it" in caplog.text
    assert engine.describe()["speculative_head"] == {
        "type": "mtp", "model": str(folder / "mtp.onnx"), "hidden_size": H,
        "draft_vocab_size": V, "executable": True, "not_executable": None}
    # the extra hidden outputs change nothing: same tokens as the plain optimum export
    plain = Engine.load(optimum_model_dir, EngineConfig(intra_op_threads=1))
    assert _greedy(engine) == _greedy(engine, mode="mtp") == _greedy(plain)
    pattern = (1, 2, 3, 4) * 10
    assert _greedy(engine, pattern, "prompt_lookup") == _greedy(plain, pattern)


@pytest.mark.parametrize(("head", "why"), [
    (EAGLE3, "executing EAGLE-3 heads is not implemented yet"),
    (SHARED, "executing shared-KV proposer heads is not implemented yet"),
    ({**MTP, "target_hidden_output": "hidden_f16"}, "non-float32 hidden states"),
    ({**MTP, "model": "mtp_hidden.onnx", "lm_head_weights": "lm_head.f32"},
     "heads that output hidden states"),
], ids=["eagle3", "shared-kv", "mtp-f16", "mtp-lm-head"])
def test_valid_heads_that_cannot_run_say_so_and_speculation_goes_on_without_them(
        target, head, why, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.generation.spec_heads"):
        engine = _load(target, head)
    assert engine.declared_head is not None and not engine.declared_head.executable
    assert why in (engine.declared_head.not_executable or "")
    assert "not implemented yet" in caplog.text and engine.mtp_head is None
    with pytest.raises(InvalidOptionError, match="'mtp' needs a model whose inference"):
        _greedy(engine, mode="mtp")
    assert _greedy(engine, mode="prompt_lookup") == _greedy(engine)


@pytest.mark.parametrize("head", [
    {**MTP, "target_hidden_output": "hidden_f16"},
    {**MTP, "model": "mtp_hidden.onnx", "lm_head_weights": "lm_head.f32",
     "embedding_weights": "embed.f32"},
    EAGLE3,
    SHARED,
    {k: v for k, v in SHARED.items() if k != "target_hidden_output"},  # auto-detected
], ids=["mtp-f16", "mtp-lm-head", "eagle3", "shared-kv", "shared-kv-detected"])
def test_heads_that_fit_pass_validation(target, head):
    engine = _load(target, head)
    assert engine.declared_head is not None
    assert engine.declared_head.config.kind == head["type"]


VIOLATIONS = [
    ("missing-hidden-output", {**MTP, "target_hidden_output": "nope"}, ModelLoadError,
     "MTP target model must expose hidden-state output 'nope'; its outputs are: logits"),
    ("mtp-dtype", {**MTP, "target_hidden_output": "hidden_f64"}, ModelLoadError,
     "'hidden_f64' must be float32 or float16 or bfloat16, got float64"),
    ("eagle3-dtype", {**EAGLE3, "target_hidden_outputs": ["h.0", "h.1", "hidden_f16"]},
     ModelLoadError, "EAGLE-3 target hidden-state output 'hidden_f16' must be float32, got "
     "float16"),
    ("shared-kv-dtype", {**SHARED, "target_hidden_output": "hidden_f16"}, ModelLoadError,
     "shared-KV proposer target hidden-state output 'hidden_f16' must be float32"),
    ("hidden-shape", {**MTP, "hidden_size": 32, "model": "mtp_narrow.onnx"}, ModelLoadError,
     r"shape \['batch_size', 'sequence_length', 64\] does not end in configured hidden size "
     r"32 .*fix: set hidden_size to the target's hidden size \(64\)"),
    ("bshc-layout", {**MTP, "hidden_layout": "bshc", "hc_mult": 2}, ModelLoadError,
     r"expected \[batch, seq, 2, 64\] \(bshc, hc_mult 2\)"),
    ("accepted-prefix", {**MTP, "cache_scope": "accepted_prefix"}, UnsupportedModelError,
     "MTP cache_scope accepted_prefix is declared but not executable"),
    ("head-hidden", {**MTP, "model": "mtp_narrow.onnx"}, ModelLoadError,
     "MTP head hidden size 32 does not match configured target hidden size 64"),
    ("eagle3-fused", {**EAGLE3, "model": "eagle3_fused2.onnx"}, ModelLoadError,
     r"EAGLE-3 head fused hidden size 128 does not match 3 target layers totaling 192"),
    ("eagle3-layers", {**EAGLE3, "target_hidden_outputs": ["h.0", "h.1"]}, ModelLoadError,
     "EAGLE-3 fuses 3 target layers; .* names 2 hidden-state outputs"),
    ("eagle3-vocab", {**EAGLE3, "model": "eagle3_wide.onnx"}, ModelLoadError,
     "EAGLE-3 draft vocabulary 600 exceeds target embedding vocabulary 512"),
    ("vocab-above-target", {**MTP, "vocab_size": 600}, ModelLoadError,
     "vocab_size 600 exceeds the target's vocabulary 512"),
    ("shared-kv-vocab", {**SHARED, "model": "assistant_small.onnx"}, ModelLoadError,
     "shared-KV proposer vocabulary 256 does not match configured vocab size 512"),
    ("weights-not-f32", {**EAGLE3, "embedding_weights": "ragged.f32"}, ModelLoadError,
     r"f32 weight file '.*ragged.f32' has byte length 131074, which is not divisible by 4"),
    ("weights-count", {**EAGLE3, "embedding_weights": "short.f32"}, ModelLoadError,
     r"holds 32704 float32 values; expected 512 x 64 = 32768"),
    ("weights-missing", {k: v for k, v in EAGLE3.items() if k != "embedding_weights"},
     ModelLoadError, "EAGLE-3 needs embedding_weights"),
    ("weights-absent-file", {**EAGLE3, "embedding_weights": "gone.f32"}, ModelLoadError,
     "embedding_weights file '.*gone.f32' does not exist"),
    ("lm-head-needed", {**MTP, "model": "mtp_hidden.onnx"}, ModelLoadError,
     "MTP needs lm_head_weights .its head outputs 'hidden_states_out', not logits"),
    ("head-io", {**EAGLE3, "model": "mtp.onnx"}, ModelLoadError,
     "configured EAGLE-3 model mtp.onnx does not expose EAGLE-3 I/O"),
    ("head-missing", {**MTP, "model": "gone.onnx"}, ModelLoadError,
     "the MTP model .*gone.onnx does not exist"),
    ("group-field", {**SHARED, "shared_kv": [{**GROUP, "key_input": None}]}, ModelLoadError,
     "shared_kv group 'g0' is missing key_input"),
    ("group-exposed", {**SHARED, "shared_kv": [{**GROUP, "value_input": "v9"}]},
     ModelLoadError, "shared-KV proposer model does not expose shared_kv group 'g0'"),
    ("group-target", {**SHARED, "shared_kv": [{**GROUP, "target_key_input": "past.9"}]},
     ModelLoadError, "reads target KV input 'past.9', which is not a KV input of the target"),
    ("no-type", {k: v for k, v in MTP.items() if k != "type"}, ModelLoadError,
     r"speculative_head.type must be one of mtp, eagle3, shared_kv, got None"),
    ("bad-k", {**MTP, "num_speculative_tokens": 0}, ModelLoadError,
     "num_speculative_tokens must be an integer > 0, got 0"),
]


@pytest.mark.parametrize(("head", "error", "message"), [v[1:] for v in VIOLATIONS],
                         ids=[v[0] for v in VIOLATIONS])
def test_each_contract_violation_is_a_load_error_with_a_fix(target, head, error, message):
    with pytest.raises(error, match=message) as caught:
        _load(target, head)
    assert caught.value.hint  # every one says how to fix it


def test_metadata_declared_violations_name_the_file(tmp_path):
    folder = write_hidden_target(tmp_path / "t", SPEC, taps=TAPS,
                                 speculative={**MTP, "cache_scope": "accepted_prefix"})
    with pytest.raises(UnsupportedModelError, match="inference_metadata.yaml: speculative"):
        Engine.load(folder, EngineConfig(intra_op_threads=1))
    folder = write_hidden_target(tmp_path / "u", SPEC, taps=TAPS, hidden_output=None,
                                 speculative={k: v for k, v in MTP.items()
                                              if k != "target_hidden_output"})
    with pytest.raises(ModelLoadError, match="MTP needs the name of the target's hidden"):
        Engine.load(folder, EngineConfig(intra_op_threads=1))


def test_models_without_a_declared_head_have_none(optimum_model_dir):
    assert Engine.load(optimum_model_dir).declared_head is None
