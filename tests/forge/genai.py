"""The onnxruntime-genai layout: GroupQueryAttention graph + ``genai_config.json``.

Mirrors the I/O of the model builder's export (``shared/reference-models/tiny-genai-fp32``):
no ``position_ids``, positions come from the attention mask; the KV head dim is the
symbolic ``kv_cache_dim``; RoPE is fused into GroupQueryAttention (``do_rotary=1``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from tests.forge.common import (
    MS_DOMAIN,
    RMS_EPS,
    ForgeSpec,
    ForgeWeights,
    Graph,
    make_weights,
    rope_tables,
    tensor_info,
    write_tokenizer_for,
)
from tests.forge.tokenizer import EOS_TOKEN_ID

_MASK = "/model/attn_mask_reformat/attn_mask_subgraph"


def _mask_subgraph(g: Graph) -> tuple[str, str]:
    """seqlens_k = ReduceSum(mask, 1) - 1 and total_sequence_length = Shape(mask)[1], int32."""
    one = g.i64(1)
    total = g.op("ReduceSum", "attention_mask", one, keepdims=0, out=f"{_MASK}/ReduceSum/output_0")
    seqlens = g.op("Sub", total, one, out=f"{_MASK}/Sub/output_0")
    seqlens = g.op("Cast", seqlens, to=TensorProto.INT32, out=f"{_MASK}/Sub/Cast/output_0")
    shape = g.op("Shape", "attention_mask", out=f"{_MASK}/Shape/output_0")
    scalar_one = g.init("const_i64_scalar_1", np.array(1, np.int64))
    length = g.op("Gather", shape, scalar_one, axis=0, out=f"{_MASK}/Gather/output_0")
    length = g.op("Cast", length, to=TensorProto.INT32, out=f"{_MASK}/Gather/Cast/output_0")
    return seqlens, length


def _skip_norm(g: Graph, residual: str, x: str, weight: str) -> tuple[str, str]:
    """SkipSimplifiedLayerNormalization: returns (normalized, residual + x)."""
    outs = g.ops(
        "SkipSimplifiedLayerNormalization",
        [residual, x, weight],
        4,
        domain=MS_DOMAIN,
        epsilon=RMS_EPS,
    )
    return outs[0], outs[3]


def build_genai_graph(
    spec: ForgeSpec, *, prune_lm_head: bool = False, weights: ForgeWeights | None = None,
    hidden_output: str | None = None,
) -> Graph:
    """The decoder graph with ``weights`` (trained ones), else ``make_weights(spec)``;
    ``hidden_output`` also outputs the final normed hidden state under that name."""
    w = weights if weights is not None else make_weights(spec)
    g = Graph("forge_genai")
    seqlens, total_len = _mask_subgraph(g)
    cos, sin = rope_tables(spec, spec.context)
    g.init("cos_cache", cos)
    g.init("sin_cache", sin)
    x = g.op("Gather", g.init("model.embed_tokens.weight", w.embed), "input_ids")
    residual = x
    mlp_out = ""
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}"
        in_norm = g.init(f"{p}.input_layernorm.weight", lw.input_norm)
        if i == 0:
            h = g.op(
                "SimplifiedLayerNormalization", x, in_norm, axis=-1, epsilon=RMS_EPS, stash_type=1
            )
        else:
            h, residual = _skip_norm(g, residual, mlp_out, in_norm)
        qkv_w = np.concatenate([lw.q_w, lw.k_w, lw.v_w], axis=1)
        qkv_b = np.concatenate([lw.q_b, lw.k_b, lw.v_b])
        qkv = g.op("MatMul", h, g.init(f"{p}.attn.qkv_proj.MatMul.weight", qkv_w))
        qkv = g.op("Add", qkv, g.init(f"{p}.attn.qkv_proj.Add.bias", qkv_b))
        gqa_inputs = [
            qkv, "", "",
            f"past_key_values.{i}.key", f"past_key_values.{i}.value",
            seqlens, total_len, "cos_cache", "sin_cache",
        ]  # fmt: skip
        attn = g.ops(
            "GroupQueryAttention",
            gqa_inputs,
            [f"{p}/attn/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"],
            domain=MS_DOMAIN,
            num_heads=spec.heads,
            kv_num_heads=spec.kv_heads,
            scale=1.0 / math.sqrt(spec.hd),
            local_window_size=-1,
            softcap=0.0,
            do_rotary=1,
            rotary_interleaved=0,
        )[0]
        o = g.op("MatMul", attn, g.init(f"{p}.attn.o_proj.MatMul.weight", lw.o_w))
        h, residual = _skip_norm(
            g, residual, o, g.init(f"{p}.post_attention_layernorm.weight", lw.post_norm)
        )
        gate = g.op("MatMul", h, g.init(f"{p}.mlp.gate_proj.MatMul.weight", lw.gate_w))
        up = g.op("MatMul", h, g.init(f"{p}.mlp.up_proj.MatMul.weight", lw.up_w))
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        mlp_out = g.op("MatMul", act, g.init(f"{p}.mlp.down_proj.MatMul.weight", lw.down_w))
    final_w = g.init(f"model.layers.{spec.layers}.final_norm_layernorm.weight", w.final_norm)
    h, _ = _skip_norm(g, residual, mlp_out, final_w)
    if hidden_output:
        g.op("Identity", h, out=hidden_output)
    if prune_lm_head:
        h = g.op("Slice", h, g.i64(-1), g.i64(np.iinfo(np.int64).max), g.i64(1))
    g.op("MatMul", h, g.init("lm_head.MatMul.weight", w.lm_head), out="logits")
    return g


ValueInfo = onnx.ValueInfoProto


def _io(spec: ForgeSpec, prune_lm_head: bool) -> tuple[list[ValueInfo], list[ValueInfo]]:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    past: list[int | str] = ["batch_size", spec.kv_heads, "past_sequence_length", "kv_cache_dim"]
    present: list[int | str] = [
        "batch_size",
        spec.kv_heads,
        "total_sequence_length",
        "kv_cache_dim",
    ]
    inputs = [
        tensor_info("input_ids", i64, ["batch_size", "sequence_length"]),
        tensor_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
    ]
    logits_seq: int | str = 1 if prune_lm_head else "sequence_length"
    outputs = [tensor_info("logits", f32, ["batch_size", logits_seq, spec.vocab])]
    for kind in ("key", "value"):  # the builder lists all keys, then all values
        for i in range(spec.layers):
            inputs.append(tensor_info(f"past_key_values.{i}.{kind}", f32, past))
            outputs.append(tensor_info(f"present.{i}.{kind}", f32, present))
    return inputs, outputs


def genai_config(spec: ForgeSpec) -> dict[str, object]:
    """A ``genai_config.json`` shaped like the model builder's."""
    return {
        "model": {
            "bos_token_id": EOS_TOKEN_ID,
            "context_length": spec.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": spec.hd,
                "hidden_size": spec.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": spec.heads,
                "num_hidden_layers": spec.layers,
                "num_key_value_heads": spec.kv_heads,
            },
            "eos_token_id": EOS_TOKEN_ID,
            "pad_token_id": EOS_TOKEN_ID,
            "type": "qwen2",
            "vocab_size": spec.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": spec.context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def write_genai_model(
    out_dir: Path,
    spec: ForgeSpec = ForgeSpec(),  # noqa: B008 - frozen dataclass
    *,
    external_data: bool = True,
    prune_lm_head: bool = False,
    tokenizer_vocab: int | None = None,
    weights: ForgeWeights | None = None,
    write_tokenizer: bool = True,
    hidden_output: str | None = None,
) -> Path:
    """Write an onnxruntime-genai model folder (model, genai_config.json, tokenizer).

    ``weights`` replaces the forged weights (shapes must match ``spec``);
    ``write_tokenizer=False`` leaves the tokenizer files to the caller; ``hidden_output``
    names an extra output, the final normed hidden state ``[batch, seq, hidden]``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs, outputs = _io(spec, prune_lm_head)
    if hidden_output:
        outputs.append(tensor_info(hidden_output, TensorProto.FLOAT,
                                   ["batch_size", "sequence_length", spec.hidden]))
    graph = build_genai_graph(spec, prune_lm_head=prune_lm_head, weights=weights,
                              hidden_output=hidden_output)
    graph.save(out_dir / "model.onnx", inputs, outputs, external_data=external_data, ms_domain=True)
    (out_dir / "genai_config.json").write_text(json.dumps(genai_config(spec), indent=4) + "\n")
    if write_tokenizer:
        write_tokenizer_for(out_dir, spec, tokenizer_vocab)
    return out_dir
