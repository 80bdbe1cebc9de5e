"""The decoder graph of an imported GGUF, shaped like onnxruntime-genai's builder export.

Inputs ``input_ids``, ``attention_mask`` and ``past_key_values.{i}.key/value``; outputs
``logits`` and ``present.{i}.key/value``; positions come from the mask
(``seqlens_k = sum(mask) - 1``, ``total_sequence_length = mask.shape[1]``); RoPE is fused
into ``GroupQueryAttention`` (``do_rotary=1``); RMS norms are (Skip)SimplifiedLayerNormalization;
quantized weights are ``MatMulNBits`` (see :mod:`engine.model.gguf_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.model.gguf_blocks import BLOCK, BlockWeight
from engine.model.onnx_proto import FLOAT, INT32, INT64
from engine.model.onnx_writer import MS_DOMAIN, OnnxWriter, tensor_info

#: A projection's weight: blocks, or a float ``[N, K]`` array (fp32 or fp16).
Linear = BlockWeight | np.ndarray


@dataclass(frozen=True)
class Tied:
    """The shape and form of a tied embedding table already written (its data is shared)."""

    bits: int  # 0: a float table
    shape: tuple[int, int]
    half: bool = False  # a float table stored as fp16
    block: int = BLOCK

_MASK = "/model/attn_mask_reformat/attn_mask_subgraph"


@dataclass(frozen=True)
class DecoderShape:
    """What the graph needs from the GGUF's metadata."""

    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    rope_theta: float
    rope_dim: int
    ffn: int = 0
    rope_scale: float = 1.0  # linear position scaling (positions / factor)
    sliding_window: int = -1


@dataclass
class LayerWeights:
    """One decoder layer's tensors, read one layer at a time."""

    attn_norm: np.ndarray
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    ffn_norm: np.ndarray
    gate: Linear
    up: Linear
    down: Linear
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    qkv: BlockWeight | None = None  # q, k and v stacked when they share a form


class GraphBuilder:
    """Builds the decoder into an :class:`OnnxWriter`, one layer at a time."""

    def __init__(self, g: OnnxWriter, shape: DecoderShape, *, compute: str = "int8") -> None:
        self.g = g
        self.s = shape
        #: MatMulNBits' accuracy level for 4-bit weights: 0 computes in fp32 (what the GGUF's
        #: own fp32 forward pass gives), 4 quantizes activations to int8. 8-bit weights keep 4
        #: (ONNX Runtime's fp32 path for them is many times slower).
        self._int4_accuracy = 0 if compute == "fp32" else 4
        self._sums: dict[tuple[str, int], str] = {}
        self._tied = Tied(0, (shape.vocab, shape.hidden))

    # -- weights ---------------------------------------------------------------------------
    def _fp32(self, array: np.ndarray, name: str) -> str:
        """An fp32 value from a stored array: fp16 is stored as is behind a Cast (which ONNX
        Runtime folds at load), anything else as fp32."""
        if array.dtype == np.float16:
            stored = self.g.init(name + "_f16", array)
            return self.g.op("Cast", stored, to=FLOAT, out=name,
                             name=f"{name}/Cast")
        return self.g.init(name, array.astype(np.float32))

    def _block_inits(self, w: BlockWeight, stem: str) -> tuple[str, str, str | None]:
        """The blocks' ``B``, fp32 scales and ``[blocks, N]`` offsets (or None)."""
        data = self.g.init(f"{stem}.weight_Q{w.bits}", w.packed())
        f = w.factors
        scales = (self._factored(f.d, f.sc, f"{stem}.weight_scales") if f is not None
                  else self._fp32(w.scales, f"{stem}.weight_scales"))
        if w.minimum is None:
            return data, scales, None
        if f is not None and f.dmin is not None and f.m is not None:
            minimum = self._factored(f.dmin, f.m, f"{stem}.weight_min", negate=True)
        else:
            minimum = self._fp32(w.minimum, f"{stem}.weight_min")
        zp = self.g.const(float(2 ** (w.bits - 1) - w.shift), np.float32)
        offsets = self.g.op("Add", minimum, self.g.op("Mul", scales, zp))
        return data, scales, self.g.op("Transpose", offsets, perm=[1, 0])

    def _factored(self, d: np.ndarray, ints: np.ndarray, name: str, negate: bool = False
                  ) -> str:
        """``d[:, :, None] * ints`` (negated) as ``[N, S * per]`` fp32, from an fp16 and a
        small-integer initializer: nodes ONNX Runtime folds at load."""
        g = self.g
        n, s, per = ints.shape
        dn = g.op("Cast", g.init(name + "_d", d), to=FLOAT)
        qn = g.op("Cast", g.init(name + "_q", ints), to=FLOAT)
        product = g.op("Mul", qn, g.op("Unsqueeze", dn, g.const([-1])))
        if negate:
            product = g.op("Neg", product)
        return g.op("Reshape", product, g.const([n, s * per]), out=name)

    def _block_sums(self, x: str, blocks: int, block: int) -> str:
        """``x`` ``[batch, seq, K]`` summed over each block: ``[batch, seq, blocks]``."""
        key = (x, blocks)
        if key not in self._sums:
            parts = self.g.op("Reshape", x, self.g.const([0, 0, blocks, block]))
            self._sums[key] = self.g.op("ReduceSum", parts, self.g.const([-1]), keepdims=0)
        return self._sums[key]

    def linear(self, x: str, w: Linear | Tied, stem: str, out: str | None = None,
               inits: tuple[str, str, str | None] | None = None) -> str:
        """``x @ w.T`` (``w`` is ``[N, K]``)."""
        if isinstance(w, Tied) and w.bits == 0:  # a float table: MatMul by its transpose
            assert inits is not None
            table = self.g.op("Transpose", inits[0], perm=[1, 0])
            if w.half:
                table = self.g.op("Cast", table, to=FLOAT)
            return self.g.op("MatMul", x, table, out=out)
        if isinstance(w, np.ndarray):
            return self.g.op("MatMul", x, self._fp32(np.ascontiguousarray(w.T),
                                                     f"{stem}.MatMul.weight"), out=out)
        n, k = w.shape
        if inits is None:
            assert isinstance(w, BlockWeight)
            inits = self._block_inits(w, f"{stem}.MatMul")
        data, scales, offsets = inits
        y = self.g.op("MatMulNBits", x, data, scales, domain=MS_DOMAIN, K=k, N=n, bits=w.bits,
                      block_size=w.block, name=f"{stem}/MatMul_Q{w.bits}",
                      accuracy_level=self._int4_accuracy if w.bits == 4 else 4,
                      out=None if offsets else out)
        if offsets is None:
            return y
        extra = self.g.op("MatMul", self._block_sums(x, k // w.block, w.block), offsets)
        return self.g.op("Add", y, extra, out=out)

    # -- the graph -------------------------------------------------------------------------
    def _mask(self) -> tuple[str, str]:
        g = self.g
        one = g.const([1])
        total = g.op("ReduceSum", "attention_mask", one, keepdims=0,
                     out=f"{_MASK}/ReduceSum/output_0")
        seqlens = g.op("Cast", g.op("Sub", total, one), to=INT32,
                       out=f"{_MASK}/Sub/Cast/output_0")
        length = g.op("Gather", g.op("Shape", "attention_mask"), g.const(1), axis=0)
        length = g.op("Cast", length, to=INT32, out=f"{_MASK}/Gather/Cast/output_0")
        return seqlens, length

    def rope(self, freq_factors: np.ndarray | None) -> None:
        s = self.s
        inv = 1.0 / (s.rope_theta ** (np.arange(0, s.rope_dim, 2, dtype=np.float64)
                                      / s.rope_dim))
        if freq_factors is not None:  # llama 3's rope_freqs.weight
            inv = inv / freq_factors.astype(np.float64)
        pos = np.arange(s.context, dtype=np.float64) / s.rope_scale
        angles = np.outer(pos, inv)
        self.g.init("cos_cache", np.cos(angles).astype(np.float32))
        self.g.init("sin_cache", np.sin(angles).astype(np.float32))

    def embedding(self, table: Linear, tied: bool) -> tuple[str, tuple[str, str, str | None]]:
        """``input_ids`` -> hidden states; returns the output and, for a tied LM head, the
        table's initializers to share."""
        g, s = self.g, self.s
        if isinstance(table, np.ndarray):
            name = g.init("model.embed_tokens.weight", table)
            self._tied = Tied(0, (s.vocab, s.hidden), table.dtype == np.float16)
            x = g.op("Gather", name, "input_ids", axis=0)
            if table.dtype != np.float32:
                x = g.op("Cast", x, to=FLOAT)
            return x, (name, "", None)
        stem = "lm_head.MatMul" if tied else "model.embed_tokens"
        self._tied = Tied(table.bits, table.shape, block=table.block)
        data, scales, offsets = self._block_inits(table, stem)
        block = table.block
        blocks = s.hidden // block
        flat = g.op("Reshape", data, g.const([s.vocab, s.hidden * table.bits // 8]))
        x = g.op("GatherBlockQuantized", flat, "input_ids", scales, domain=MS_DOMAIN,
                 bits=table.bits, block_size=block, gather_axis=0, quantize_axis=1,
                 name="/model/embed_tokens/GatherBlockQuantized")
        if offsets is not None:
            rows = g.op("Gather", g.op("Transpose", offsets, perm=[1, 0]), "input_ids", axis=0)
            x = g.op("Reshape", x, g.const([0, 0, blocks, block]))
            x = g.op("Add", x, g.op("Unsqueeze", rows, g.const([-1])))
            x = g.op("Reshape", x, g.const([0, 0, s.hidden]))
        return x, (data, scales, offsets)

    def _head_norm(self, x: str, weight: np.ndarray, heads: int, name: str) -> str:
        g, s = self.g, self.s
        per_head = g.op("Reshape", x, g.const([0, 0, heads, s.head_dim]))
        normed = g.op("SimplifiedLayerNormalization", per_head, g.init(name, weight),
                      axis=-1, epsilon=s.rms_eps, stash_type=1)
        return g.op("Reshape", normed, g.const([0, 0, heads * s.head_dim]))

    def layer(self, i: int, x: str, residual: str | None, lw: LayerWeights,
              mask: tuple[str, str]) -> tuple[str, str]:
        """One decoder layer; returns (mlp output, residual) for the next layer's norm."""
        g, s = self.g, self.s
        p = f"model.layers.{i}"
        norm_w = g.init(f"{p}.input_layernorm.weight", lw.attn_norm)
        if residual is None:
            h = g.op("SimplifiedLayerNormalization", x, norm_w, axis=-1, epsilon=s.rms_eps,
                     stash_type=1)
            residual = x
        else:
            h, residual = self._skip_norm(residual, x, norm_w)
        if lw.qkv is not None:
            qkv = self.linear(h, lw.qkv, f"{p}.attn.qkv_proj")
            if lw.q_bias is not None and lw.k_bias is not None and lw.v_bias is not None:
                qkv_bias = np.concatenate([lw.q_bias, lw.k_bias, lw.v_bias]).astype(np.float32)
                qkv = g.op("Add", qkv, g.init(f"{p}.attn.qkv_proj.Add.bias", qkv_bias))
            qkv_in = [qkv, "", ""]
        else:
            qkv_in = []
            parts: list[tuple[str, Linear, np.ndarray | None, np.ndarray | None, int]] = [
                ("q", lw.q, lw.q_bias, lw.q_norm, s.heads),
                ("k", lw.k, lw.k_bias, lw.k_norm, s.kv_heads),
                ("v", lw.v, lw.v_bias, None, s.kv_heads)]
            for tag, w, bias, norm, heads in parts:
                y = self.linear(h, w, f"{p}.attn.{tag}_proj")
                if bias is not None:
                    y = g.op("Add", y, g.init(f"{p}.attn.{tag}_proj.Add.bias",
                                              bias.astype(np.float32)))
                if norm is not None:
                    y = self._head_norm(y, norm, heads, f"{p}.attn.{tag}_norm.weight")
                qkv_in.append(y)
        attn = g.ops("GroupQueryAttention",
                     [*qkv_in, f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                      mask[0], mask[1], "cos_cache", "sin_cache"],
                     [f"/model/layers.{i}/attn/GroupQueryAttention/output_0",
                      f"present.{i}.key", f"present.{i}.value"],
                     domain=MS_DOMAIN, name=f"/model/layers.{i}/attn/GroupQueryAttention",
                     num_heads=s.heads, kv_num_heads=s.kv_heads,
                     scale=1.0 / math.sqrt(s.head_dim), local_window_size=s.sliding_window,
                     softcap=0.0, do_rotary=1, rotary_interleaved=0)[0]
        o = self.linear(attn, lw.o, f"{p}.attn.o_proj")
        h, residual = self._skip_norm(residual, o,
                                      g.init(f"{p}.post_attention_layernorm.weight", lw.ffn_norm))
        gate = self.linear(h, lw.gate, f"{p}.mlp.gate_proj")
        up = self.linear(h, lw.up, f"{p}.mlp.up_proj")
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        return self.linear(act, lw.down, f"{p}.mlp.down_proj"), residual

    def _skip_norm(self, residual: str, x: str, weight: str) -> tuple[str, str]:
        outs = self.g.ops("SkipSimplifiedLayerNormalization", [residual, x, weight], 4,
                          domain=MS_DOMAIN, epsilon=self.s.rms_eps)
        return outs[0], outs[3]

    def build(self, embed: Callable[[], Linear], tied: bool,
              layer: Callable[[int], LayerWeights], final_norm: Callable[[], np.ndarray],
              head: Callable[[], Linear] | None, freq_factors: np.ndarray | None,
              progress: Callable[[str], None]) -> None:
        """The whole decoder; each callable reads its tensors when it is called."""
        s, g = self.s, self.g
        mask = self._mask()
        self.rope(freq_factors)
        x, shared = self.embedding(embed(), tied)
        progress("token_embd.weight")
        residual: str | None = None
        for i in range(s.layers):
            x, residual = self.layer(i, x, residual, layer(i), mask)
            progress(f"blk.{i}")
        assert residual is not None
        norm = g.init(f"model.layers.{s.layers}.final_norm_layernorm.weight", final_norm())
        h, _ = self._skip_norm(residual, x, norm)
        if head is None:  # tied: the embedding's table, shared
            self.linear(h, self._tied, "lm_head", out="logits", inits=shared)
        else:
            self.linear(h, head(), "lm_head", out="logits")
        progress("output.weight")

    def io(self) -> tuple[list[bytes], list[bytes]]:
        s = self.s
        f32, i64 = FLOAT, INT64
        inputs = [tensor_info("input_ids", i64, ["batch_size", "sequence_length"]),
                  tensor_info("attention_mask", i64, ["batch_size", "total_sequence_length"])]
        outputs = [tensor_info("logits", f32, ["batch_size", "sequence_length", s.vocab])]
        for kind in ("key", "value"):
            for i in range(s.layers):
                inputs.append(tensor_info(f"past_key_values.{i}.{kind}", f32,
                                          ["batch_size", s.kv_heads, "past_sequence_length",
                                           "kv_cache_dim"]))
                outputs.append(tensor_info(f"present.{i}.{kind}", f32,
                                           ["batch_size", s.kv_heads, "total_sequence_length",
                                            "kv_cache_dim"]))
        return inputs, outputs
