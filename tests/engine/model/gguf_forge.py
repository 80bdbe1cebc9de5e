"""Small GGUF files made in code with ``gguf.GGUFWriter``: a tiny decoder of a chosen
architecture with its projections in a chosen GGUF type, and a real vocabulary.

The vocabulary is the forge's byte-level BPE (``tests/forge/tokenizer.py``: vocabulary,
merges, control tokens, ChatML template), written as a ``gpt2`` GGUF vocabulary with the
``qwen2`` pre-tokenizer (the same split), so the imported ``tokenizer.json`` can be checked
against the one it came from. Legacy types are quantized by ``gguf``'s own numpy code;
K-quants, which it only dequantizes, are random blocks with sane scales (the untied output
of a K-quant model is Q6_K, as in llama.cpp's Q4_K_M files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, quants
from gguf.constants import GGML_QUANT_SIZES

from tests.forge.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, make_tokenizer_files

#: K-quant block layouts: byte offsets of their fp16 fields (d, dmin)
_KQUANT_FP16 = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,), QT.Q3_K: (108,),
                QT.Q2_K: (80, 82)}
#: the largest |sub-block scale * code| of each type, to size ``d`` so |w| stays near 0.15
_KQUANT_RANGE = {QT.Q4_K: 63 * 15, QT.Q5_K: 63 * 31, QT.Q6_K: 128 * 32, QT.Q3_K: 32 * 4,
                 QT.Q2_K: 15 * 3}


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"
    qtype: QT = QT.Q4_0
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    context: int = 128
    tied: bool = True
    seed: int = 0


def tokenizer_source(tmp: Path) -> Path:
    """The forge's tokenizer folder (tokenizer.json and friends), built once per session."""
    return make_tokenizer_files(tmp / "tokenizer-src", 512)


def _vocab(tok_dir: Path) -> tuple[list[str], list[int], list[str]]:
    data = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(data["model"]["vocab"])
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [""] * (max(vocab.values()) + 1)
    for text, tid in vocab.items():
        tokens[tid] = text
    types = [3 if t in SPECIAL_TOKENS else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, types, merges


def _kquant(rng: np.random.Generator, qtype: QT, n: int, k: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for at in _KQUANT_FP16[qtype]:
        top = 0.15 / _KQUANT_RANGE[qtype]
        scale = rng.uniform(top / 2, top, size=(n, k // block)).astype(np.float16)
        raw[..., at:at + 2] = scale.view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, -1)


def _weight(w: GGUFWriter, rng: np.random.Generator, name: str, shape: tuple[int, int],
            qtype: QT, scale: float) -> None:
    """A ``[N, K]`` weight (GGUF shape ``[K, N]``) in ``qtype``."""
    n, k = shape
    if qtype in _KQUANT_FP16:
        w.add_tensor(name, _kquant(rng, qtype, n, k), raw_dtype=qtype)
        return
    dense = (rng.standard_normal((n, k)) * scale).astype(np.float32)
    if qtype == QT.F32:
        w.add_tensor(name, dense)
    elif qtype == QT.F16:
        w.add_tensor(name, dense.astype(np.float16))
    else:
        w.add_tensor(name, quants.quantize(dense, qtype), raw_dtype=qtype)


def write_gguf(path: Path, spec: TinySpec, tok_dir: Path, *,
               arch_name: str | None = None, ffn_in_metadata: int | None = None) -> Path:
    """A tiny GGUF decoder at ``path``; ``arch_name`` overrides general.architecture,
    ``ffn_in_metadata`` the feed-forward size its metadata claims."""
    tokens, types, merges = _vocab(tok_dir)
    vocab = len(tokens)
    rng = np.random.default_rng(spec.seed)
    arch = arch_name or spec.arch
    w = GGUFWriter(str(path), arch)
    w.add_block_count(spec.layers)
    w.add_context_length(spec.context)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(ffn_in_metadata or spec.ffn)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    q_dim, kv_dim = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    _weight(w, rng, "token_embd.weight", (vocab, spec.hidden), spec.qtype, 0.5)

    def norm(name: str, size: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    for i in range(spec.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", spec.hidden)
        for name, n, k in (("attn_q", q_dim, spec.hidden), ("attn_k", kv_dim, spec.hidden),
                           ("attn_v", kv_dim, spec.hidden), ("attn_output", spec.hidden, q_dim),
                           ("ffn_gate", spec.ffn, spec.hidden), ("ffn_up", spec.ffn, spec.hidden),
                           ("ffn_down", spec.hidden, spec.ffn)):
            _weight(w, rng, p + name + ".weight", (n, k), spec.qtype, 1.0 / np.sqrt(k))
        if spec.arch == "qwen2":
            for name, n in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                w.add_tensor(p + name + ".bias",
                             (0.1 * rng.standard_normal(n)).astype(np.float32))
        if spec.arch == "qwen3":
            norm(p + "attn_q_norm.weight", spec.head_dim)
            norm(p + "attn_k_norm.weight", spec.head_dim)
        norm(p + "ffn_norm.weight", spec.hidden)
    norm("output_norm.weight", spec.hidden)
    if not spec.tied:
        _weight(w, rng, "output.weight", (vocab, spec.hidden), spec.qtype
                if spec.qtype not in _KQUANT_FP16 else QT.Q6_K, 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
