"""A small Qwen2-style decoder in PyTorch: GQA, RoPE (half split), RMSNorm, SwiGLU, q/k/v
biases, tied input/output embeddings. Same maths as the exported GroupQueryAttention graph."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

RMS_EPS = 1e-6


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 8192
    hidden: int = 192
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    intermediate: int = 512
    context: int = 512
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return x * scale * self.weight


def rope_cache(cfg: ModelConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, hd]; cos/sin [S, hd/2] (rotate_half convention, as GQA's non-interleaved)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=True)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=True)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=True)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        cfg, hd = self.cfg, self.cfg.head_dim
        q = self.q_proj(x).view(b, s, cfg.heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, cfg.kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, cfg.kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = cfg.heads // cfg.kv_heads  # query head h reads KV head h // group
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, cfg.heads * hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)
        cos, sin = rope_cache(cfg, cfg.context)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = 0.02
        residual_std = std / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                continue
            is_residual = name.endswith(("o_proj.weight", "down_proj.weight"))
            nn.init.normal_(p, 0.0, residual_std if is_residual else std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, S, vocab]; the output projection is the embedding matrix (tied)."""
        s = ids.shape[1]
        cos, sin = self.cos[:s], self.sin[:s]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.embed_tokens.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
