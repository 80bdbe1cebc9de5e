"""Export a trained :class:`Decoder` to the onnxruntime-genai layout (GroupQueryAttention,
shared KV buffer, ``genai_config.json``) with the forge's graph builder, plus tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from tests.forge.common import ForgeSpec, ForgeWeights, LayerWeights
from tests.forge.genai import write_genai_model
from tools.default_model.model import Decoder, ModelConfig
from tools.default_model.tokenizer import (
    ENDOFTEXT,
    IM_END,
    MODEL_MAX_LENGTH,
    write_tokenizer_files,
)


def forge_spec(cfg: ModelConfig) -> ForgeSpec:
    return ForgeSpec(layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                     kv_heads=cfg.kv_heads, intermediate=cfg.intermediate, vocab=cfg.vocab,
                     context=cfg.context, rope_theta=cfg.rope_theta)


def _np(t: torch.Tensor, transpose: bool = False) -> np.ndarray:
    a = t.detach().to(torch.float32).cpu().numpy()
    return np.ascontiguousarray(a.T if transpose else a)


def to_forge_weights(model: Decoder) -> ForgeWeights:
    """Torch's ``[out, in]`` matrices as the forge's ``[in, out]``; lm_head = embedding^T."""
    embed = _np(model.embed_tokens.weight)
    weights = ForgeWeights(embed=embed)
    for block in model.layers:
        attn, mlp = block.self_attn, block.mlp
        weights.layers.append(LayerWeights(
            input_norm=_np(block.input_layernorm.weight),
            q_w=_np(attn.q_proj.weight, True), q_b=_np(attn.q_proj.bias),
            k_w=_np(attn.k_proj.weight, True), k_b=_np(attn.k_proj.bias),
            v_w=_np(attn.v_proj.weight, True), v_b=_np(attn.v_proj.bias),
            o_w=_np(attn.o_proj.weight, True),
            post_norm=_np(block.post_attention_layernorm.weight),
            gate_w=_np(mlp.gate_proj.weight, True), up_w=_np(mlp.up_proj.weight, True),
            down_w=_np(mlp.down_proj.weight, True),
        ))
    weights.final_norm = _np(model.norm.weight)
    weights.lm_head = np.ascontiguousarray(embed.T)
    return weights


def export_model(model: Decoder, tok: Tokenizer, out_dir: Path) -> Path:
    """Write ``model.onnx`` (+ ``.data``), ``genai_config.json`` and the tokenizer files."""
    cfg = model.cfg
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        weights = to_forge_weights(model)
    write_genai_model(out_dir, forge_spec(cfg), weights=weights, write_tokenizer=False)
    write_tokenizer_files(tok, out_dir)
    config_path = out_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    eos, im_end = tok.token_to_id(ENDOFTEXT), tok.token_to_id(IM_END)
    config["model"].update(bos_token_id=eos, eos_token_id=[eos, im_end], pad_token_id=eos,
                           context_length=min(cfg.context, MODEL_MAX_LENGTH))
    config_path.write_text(json.dumps(config, indent=4) + "\n")
    return out_dir
