"""The optimum layout: standard ONNX ops, ``position_ids`` input, KV grown by concatenation.

Mirrors the I/O of optimum's ``text-generation-with-past`` export
(``shared/reference-models/tiny-optimum``) and writes an HF ``config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import onnx
from onnx import TensorProto

from tests.forge.common import (
    ForgeSpec,
    Graph,
    apply_rope,
    grouped_attention,
    make_weights,
    qkv_heads,
    rms_norm,
    rope_tables,
    swiglu,
    tensor_info,
    write_tokenizer_for,
)
from tests.forge.tokenizer import EOS_TOKEN_ID

_TOTAL = "past_sequence_length + sequence_length"


def _allowed_mask(g: Graph) -> str:
    """Bool [B, 1, 1, S, T]: key j is visible to new query i iff j <= past + i and mask[j] == 1."""
    total = g.op("Gather", g.op("Shape", "attention_mask"), g.i64(1))  # [1]
    seq = g.op("Gather", g.op("Shape", "input_ids"), g.i64(1))
    past = g.op("Sub", total, seq)
    zero, one = g.i64(0), g.i64(1)
    scalar = g.i64()  # empty shape -> reshape to a scalar for Range
    keys = g.op(
        "Range",
        g.op("Reshape", zero, scalar),
        g.op("Reshape", total, scalar),
        g.op("Reshape", one, scalar),
    )
    queries = g.op(
        "Range",
        g.op("Reshape", past, scalar),
        g.op("Reshape", total, scalar),
        g.op("Reshape", one, scalar),
    )
    causal = g.op("LessOrEqual", keys, g.op("Unsqueeze", queries, g.i64(1)))  # [S, T]
    valid = g.op("Cast", "attention_mask", to=TensorProto.BOOL)
    valid = g.op("Unsqueeze", valid, g.i64(1, 2, 3))  # [B, 1, 1, 1, T]
    return g.op("And", causal, valid)


def build_optimum_graph(spec: ForgeSpec, taps: Mapping[int, str] | None = None, *,
                        kv_cache: bool = True) -> Graph:
    """The decoder graph; `taps` names extra tensors to expose: layer i's residual stream
    after the layer, or -1 for the final normed hidden state (what the LM head reads).
    Without `kv_cache` there are no past/present tensors: every step reruns the sequence."""
    taps = taps or {}
    w = make_weights(spec)
    g = Graph("forge_optimum")
    cos_t, sin_t = rope_tables(spec, spec.context)
    cos = g.op("Unsqueeze", g.op("Gather", g.init("rope.cos", cos_t), "position_ids"), g.i64(1))
    sin = g.op("Unsqueeze", g.op("Gather", g.init("rope.sin", sin_t), "position_ids"), g.i64(1))
    allowed = _allowed_mask(g)
    x = g.op("Gather", g.init("model.embed_tokens.weight", w.embed), "input_ids")
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}"
        h = rms_norm(g, x, g.init(f"{p}.input_layernorm.weight", lw.input_norm))
        q, k, v = qkv_heads(g, spec, h, p, lw)
        q, k = apply_rope(g, q, cos, sin), apply_rope(g, k, cos, sin)
        keys, values = k, v
        if kv_cache:
            keys = g.op("Concat", f"past_key_values.{i}.key", k, axis=2, out=f"present.{i}.key")
            values = g.op("Concat", f"past_key_values.{i}.value", v, axis=2,
                          out=f"present.{i}.value")
        ctx = grouped_attention(g, spec, q, keys, values, allowed)
        o_w = g.init(f"{p}.self_attn.o_proj.weight", lw.o_w)
        x = g.op("Add", x, g.op("MatMul", ctx, o_w))
        h = rms_norm(g, x, g.init(f"{p}.post_attention_layernorm.weight", lw.post_norm))
        x = g.op("Add", x, swiglu(g, h, p, lw))
        if i in taps:
            g.op("Identity", x, out=taps[i])
    h = rms_norm(g, x, g.init("model.norm.weight", w.final_norm))
    if -1 in taps:
        g.op("Identity", h, out=taps[-1])
    g.op("MatMul", h, g.init("lm_head.weight", w.lm_head), out="logits")
    return g


ValueInfo = onnx.ValueInfoProto


def _io(spec: ForgeSpec, kv_cache: bool = True) -> tuple[list[ValueInfo], list[ValueInfo]]:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        tensor_info("input_ids", i64, ["batch_size", "sequence_length"]),
        tensor_info("attention_mask", i64, ["batch_size", _TOTAL]),
        tensor_info("position_ids", i64, ["batch_size", "sequence_length"]),
    ]
    outputs = [tensor_info("logits", f32, ["batch_size", "sequence_length", spec.vocab])]
    for i in range(spec.layers if kv_cache else 0):
        for kind in ("key", "value"):
            past: list[int | str] = ["batch_size", spec.kv_heads, "past_sequence_length", spec.hd]
            inputs.append(tensor_info(f"past_key_values.{i}.{kind}", f32, past))
            present: list[int | str] = ["batch_size", spec.kv_heads, _TOTAL, spec.hd]
            outputs.append(tensor_info(f"present.{i}.{kind}", f32, present))
    return inputs, outputs


def hf_config(spec: ForgeSpec) -> dict[str, object]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": EOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,
        "head_dim": spec.hd,
        "hidden_act": "silu",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "max_position_embeddings": spec.context,
        "model_type": "qwen2",
        "num_attention_heads": spec.heads,
        "num_hidden_layers": spec.layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": spec.vocab,
    }


def write_optimum_model(
    out_dir: Path,
    spec: ForgeSpec = ForgeSpec(),  # noqa: B008 - frozen dataclass
    *,
    external_data: bool = False,
    tokenizer_vocab: int | None = None,
    kv_cache: bool = True,
) -> Path:
    """Write an optimum-style folder: model.onnx, config.json, generation_config.json, tokenizer.

    Without `kv_cache` the graph has no past/present KV (the engine's recompute path)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs, outputs = _io(spec, kv_cache)
    build_optimum_graph(spec, kv_cache=kv_cache).save(
        out_dir / "model.onnx", inputs, outputs, external_data=external_data
    )
    (out_dir / "config.json").write_text(json.dumps(hf_config(spec), indent=2) + "\n")
    generation = {
        "bos_token_id": EOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_tokenizer_for(out_dir, spec, tokenizer_vocab)
    return out_dir
