"""The static-cache layout (the project's own contract, described by ``inference_metadata.yaml``).

Inputs: ``input_ids`` [1, S] int64, ``position_ids`` [1, S] int64, ``attention_mask``
[1, max_len] int64 (1 where a key slot holds a valid token, the new ones included) and
``past_key_values.N.key/value`` float32 [1, kv_heads, max_len, head_dim].
Outputs: ``logits`` [1, S, vocab] and ``present.N.key/value`` [1, kv_heads, max_len, head_dim]:
the past with the new rows written at slots ``position_ids`` (ScatterND, which skips its
copy when the output is bound to the same buffer as the input). The query at position p
attends to slots j <= p whose mask is 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


def _allowed_mask(g: Graph, max_len: int) -> str:
    """Bool [1, 1, 1, S, max_len]: slot j is visible to the query at p iff j <= p and mask[j]."""
    slots = g.init("static.slots", np.arange(max_len, dtype=np.int64))
    causal = g.op("LessOrEqual", slots, g.op("Unsqueeze", "position_ids", g.i64(-1)))  # [1, S, T]
    valid = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL), g.i64(1))
    return g.op("Unsqueeze", g.op("And", causal, valid), g.i64(1, 2))


def _scatter_indices(g: Graph, spec: ForgeSpec) -> str:
    """ScatterND indices [1, kv_heads, S, 3] holding (0, head, position_ids[s])."""
    pos = g.op("Expand", "position_ids", g.i64(spec.kv_heads, 1))  # [KV, S]
    heads = g.init("static.kv_head_index", np.arange(spec.kv_heads, dtype=np.int64)[:, None])
    heads = g.op("Expand", heads, g.op("Shape", pos))
    batch = g.op("Sub", heads, heads)
    parts = [g.op("Unsqueeze", t, g.i64(-1)) for t in (batch, heads, pos)]
    return g.op("Unsqueeze", g.op("Concat", *parts, axis=-1), g.i64(0))


def build_static_graph(spec: ForgeSpec, max_len: int, hidden_output: str | None = None) -> Graph:
    w = make_weights(spec)
    g = Graph("forge_static")
    cos_t, sin_t = rope_tables(spec, max_len)
    cos = g.op("Unsqueeze", g.op("Gather", g.init("rope.cos", cos_t), "position_ids"), g.i64(1))
    sin = g.op("Unsqueeze", g.op("Gather", g.init("rope.sin", sin_t), "position_ids"), g.i64(1))
    allowed = _allowed_mask(g, max_len)
    index = _scatter_indices(g, spec)
    x = g.op("Gather", g.init("model.embed_tokens.weight", w.embed), "input_ids")
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}"
        h = rms_norm(g, x, g.init(f"{p}.input_layernorm.weight", lw.input_norm))
        q, k, v = qkv_heads(g, spec, h, p, lw)
        q, k = apply_rope(g, q, cos, sin), apply_rope(g, k, cos, sin)
        keys = g.op("ScatterND", f"past_key_values.{i}.key", index, k, out=f"present.{i}.key")
        values = g.op("ScatterND", f"past_key_values.{i}.value", index, v, out=f"present.{i}.value")
        ctx = grouped_attention(g, spec, q, keys, values, allowed)
        x = g.op("Add", x, g.op("MatMul", ctx, g.init(f"{p}.self_attn.o_proj.weight", lw.o_w)))
        h = rms_norm(g, x, g.init(f"{p}.post_attention_layernorm.weight", lw.post_norm))
        x = g.op("Add", x, swiglu(g, h, p, lw))
    h = rms_norm(g, x, g.init("model.norm.weight", w.final_norm))
    if hidden_output:
        g.op("Identity", h, out=hidden_output)
    g.op("MatMul", h, g.init("lm_head.weight", w.lm_head), out="logits")
    return g


ValueInfo = onnx.ValueInfoProto


def _io(spec: ForgeSpec, max_len: int) -> tuple[list[ValueInfo], list[ValueInfo]]:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        tensor_info("input_ids", i64, [1, "sequence_length"]),
        tensor_info("position_ids", i64, [1, "sequence_length"]),
        tensor_info("attention_mask", i64, [1, max_len]),
    ]
    outputs = [tensor_info("logits", f32, [1, "sequence_length", spec.vocab])]
    cache = [1, spec.kv_heads, max_len, spec.hd]
    for i in range(spec.layers):
        for kind in ("key", "value"):
            inputs.append(tensor_info(f"past_key_values.{i}.{kind}", f32, cache))
            outputs.append(tensor_info(f"present.{i}.{kind}", f32, cache))
    return inputs, outputs


def inference_metadata(spec: ForgeSpec, max_len: int) -> str:
    """The ``inference_metadata.yaml`` text for a static-cache model."""
    lines = [
        "inference_metadata_version: 1",
        "model_file: model.onnx",
        "decode_path: static_cache",
        f"max_sequence_length: {max_len}",
        "io:",
        "  input_ids: input_ids",
        "  attention_mask: attention_mask",
        "  position_ids: position_ids",
        "  logits: logits",
        "kv_pairs:",
    ]
    for i in range(spec.layers):
        for kind in ("key", "value"):
            lines.append(f"  - {{input: past_key_values.{i}.{kind}, output: present.{i}.{kind}}}")
    lines.append(f"eos_token_ids: [{EOS_TOKEN_ID}]")
    return "\n".join(lines) + "\n"


def write_static_model(
    out_dir: Path,
    spec: ForgeSpec = ForgeSpec(),  # noqa: B008 - frozen dataclass
    *,
    max_len: int = 64,
    external_data: bool = False,
    tokenizer_vocab: int | None = None,
    hidden_output: str | None = None,
) -> Path:
    """Write a static-cache folder (model.onnx, inference_metadata.yaml, tokenizer);
    ``hidden_output`` names an extra output, the final normed hidden state."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs, outputs = _io(spec, max_len)
    if hidden_output:
        outputs.append(tensor_info(hidden_output, TensorProto.FLOAT,
                                   [1, "sequence_length", spec.hidden]))
    graph = build_static_graph(spec, max_len, hidden_output)
    graph.save(out_dir / "model.onnx", inputs, outputs, external_data=external_data)
    (out_dir / "inference_metadata.yaml").write_text(inference_metadata(spec, max_len))
    write_tokenizer_for(out_dir, spec, tokenizer_vocab)
    return out_dir
