"""Shared pieces of the forge: the spec, deterministic weights and a small graph builder."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.forge.tokenizer import make_tokenizer_files

RMS_EPS = 1e-6
OPSET = 21
IR_VERSION = 10
MS_DOMAIN = "com.microsoft"
_EXTERNAL_MIN_BYTES = 1024
_ALIGN = 4096


@dataclass(frozen=True)
class ForgeSpec:
    """Shape and seed of a forged Qwen2-style decoder. Same spec and seed -> same weights."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None
    intermediate: int = 128
    vocab: int = 512
    context: int = 256
    rope_theta: float = 10000.0
    seed: int = 0
    sharp: bool = True

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.hd % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.hd}")

    @property
    def hd(self) -> int:
        """The head size actually used (``head_dim`` or ``hidden // heads``)."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


@dataclass
class LayerWeights:
    input_norm: np.ndarray
    q_w: np.ndarray  # [hidden, q_dim]; every matrix is stored [in, out] for x @ W
    q_b: np.ndarray
    k_w: np.ndarray
    k_b: np.ndarray
    v_w: np.ndarray
    v_b: np.ndarray
    o_w: np.ndarray
    post_norm: np.ndarray
    gate_w: np.ndarray
    up_w: np.ndarray
    down_w: np.ndarray


@dataclass
class ForgeWeights:
    embed: np.ndarray  # [vocab, hidden]
    layers: list[LayerWeights] = field(default_factory=list)
    final_norm: np.ndarray = field(default_factory=lambda: np.ones(0, np.float32))
    lm_head: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))


def make_weights(spec: ForgeSpec) -> ForgeWeights:
    """Deterministic float32 weights for ``spec``.

    Scaled by 1/sqrt(fan_in) and by 1/sqrt(2 * layers) on the residual branches so
    logits stay sane at depth. "Sharp" weights have larger q/k projections (peaked,
    position-sensitive attention), non-zero biases and non-unit norm weights.
    """
    rng = np.random.default_rng(spec.seed)
    h, q_dim, kv_dim, inter = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(std)
        return out

    def norm_w(n: int) -> np.ndarray:
        if not spec.sharp:
            return np.ones(n, np.float32)
        return (1.0 + normal((n,), 0.3)).astype(np.float32)

    def bias(n: int, std: float) -> np.ndarray:
        return normal((n,), std) if spec.sharp else np.zeros(n, np.float32)

    qk_gain = 2.0 if spec.sharp else 1.0
    res = 1.0 / math.sqrt(2 * spec.layers)
    weights = ForgeWeights(embed=normal((spec.vocab, h), 1.0))
    for _ in range(spec.layers):
        weights.layers.append(
            LayerWeights(
                input_norm=norm_w(h),
                q_w=normal((h, q_dim), qk_gain / math.sqrt(h)),
                q_b=bias(q_dim, 0.5),
                k_w=normal((h, kv_dim), qk_gain / math.sqrt(h)),
                k_b=bias(kv_dim, 0.5),
                v_w=normal((h, kv_dim), 1.0 / math.sqrt(h)),
                v_b=bias(kv_dim, 0.2),
                o_w=normal((q_dim, h), res / math.sqrt(q_dim)),
                post_norm=norm_w(h),
                gate_w=normal((h, inter), 1.0 / math.sqrt(h)),
                up_w=normal((h, inter), 1.0 / math.sqrt(h)),
                down_w=normal((inter, h), 2.0 * res / math.sqrt(inter)),
            )
        )
    weights.final_norm = norm_w(h)
    weights.lm_head = normal((h, spec.vocab), (3.0 if spec.sharp else 1.0) / math.sqrt(h))
    return weights


def rope_tables(spec: ForgeSpec, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables ``[rows, head_dim // 2]`` (half-split "rotate_half" convention)."""
    inv_freq = 1.0 / (spec.rope_theta ** (np.arange(0, spec.hd, 2, dtype=np.float64) / spec.hd))
    angles = np.outer(np.arange(rows, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def write_tokenizer_for(out_dir: Path, spec: ForgeSpec, tokenizer_vocab: int | None) -> None:
    """Tokenizer files for a model of ``spec`` (vocab ``spec.vocab`` unless given, <= it)."""
    vocab = spec.vocab if tokenizer_vocab is None else tokenizer_vocab
    if vocab > spec.vocab:
        raise ValueError(
            f"tokenizer vocab ({vocab}) must not exceed the model vocab ({spec.vocab})"
        )
    make_tokenizer_files(out_dir, vocab)


def tensor_info(name: str, elem_type: int, dims: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(dims))


class Graph:
    """Accumulates nodes and initializers; writes the model (optionally with external data)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[tuple[str, np.ndarray]] = []
        self._consts: dict[tuple[str, tuple[int | float, ...]], str] = {}
        self._count = 0

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append((name, np.ascontiguousarray(array)))
        return name

    def i64(self, *values: int) -> str:
        """A 1-D int64 constant (cached)."""
        key = ("i64", tuple(values))
        if key not in self._consts:
            name = f"const_i64_{'_'.join(str(v).replace('-', 'm') for v in values)}"
            self._consts[key] = self.init(name, np.array(values, np.int64))
        return self._consts[key]

    def f32(self, value: float) -> str:
        """A scalar float32 constant (cached)."""
        key = ("f32", (value,))
        if key not in self._consts:
            self._consts[key] = self.init(
                f"const_f32_{len(self._consts)}", np.array(value, np.float32)
            )
        return self._consts[key]

    def _name(self, op_type: str) -> str:
        self._count += 1
        return f"/{op_type}_{self._count}"

    def ops(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str] | int = 1,
        *,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        """Add one node; ``outputs`` is a list of names or a count of fresh names."""
        node_name = self._name(op_type)
        outs = (
            [f"{node_name}/out{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
        )
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), list(outs), name=node_name, domain=domain, **attrs
            )
        )
        return list(outs)

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        """Add a single-output standard-domain node and return its output name."""
        return self.ops(op_type, inputs, [out] if out else 1, **attrs)[0]

    def save(
        self,
        path: Path,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        *,
        external_data: bool,
        ms_domain: bool = False,
    ) -> Path:
        """Write ``path`` (and ``path.name + '.data'`` when ``external_data``)."""
        opsets = [helper.make_opsetid("", OPSET)]
        if ms_domain:
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        data_path = path.with_name(path.name + ".data")
        if data_path.exists():
            data_path.unlink()
        initializers = (
            _write_external(self.inits, data_path)
            if external_data
            else [numpy_helper.from_array(a, n) for n, a in self.inits]
        )
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, initializers)
        model = helper.make_model(
            graph, opset_imports=opsets, producer_name="tests.forge", ir_version=IR_VERSION
        )
        onnx.save_model(model, str(path))
        return path


def _write_external(inits: list[tuple[str, np.ndarray]], data_path: Path) -> list[TensorProto]:
    """Write big initializers straight into ``data_path`` (page-aligned); small ones inline."""
    tensors: list[TensorProto] = []
    offset = 0
    with data_path.open("wb") as f:
        for name, array in inits:
            if array.nbytes < _EXTERNAL_MIN_BYTES:
                tensors.append(numpy_helper.from_array(array, name))
                continue
            pad = (-offset) % _ALIGN
            f.write(b"\0" * pad)
            offset += pad
            array.tofile(f)
            t = TensorProto()
            t.name = name
            t.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            t.dims.extend(array.shape)
            t.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", data_path.name),
                ("offset", str(offset)),
                ("length", str(array.nbytes)),
            ):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            tensors.append(t)
            offset += array.nbytes
    return tensors


# ---- standard-op building blocks shared by the optimum and static layouts ----------------


def rms_norm(g: Graph, x: str, weight: str) -> str:
    ms = g.op("ReduceMean", g.op("Mul", x, x), g.i64(-1), keepdims=1)
    std = g.op("Sqrt", g.op("Add", ms, g.f32(RMS_EPS)))
    return g.op("Mul", g.op("Div", x, std), weight)


def swiglu(g: Graph, x: str, prefix: str, lw: LayerWeights) -> str:
    gate = g.op("MatMul", x, g.init(f"{prefix}.mlp.gate_proj.weight", lw.gate_w))
    up = g.op("MatMul", x, g.init(f"{prefix}.mlp.up_proj.weight", lw.up_w))
    act = g.op("Mul", gate, g.op("Sigmoid", gate))
    return g.op("MatMul", g.op("Mul", act, up), g.init(f"{prefix}.mlp.down_proj.weight", lw.down_w))


def heads_first(g: Graph, x: str, n_heads: int, hd: int) -> str:
    """[B, S, n*hd] -> [B, n, S, hd]."""
    return g.op("Transpose", g.op("Reshape", x, g.i64(0, 0, n_heads, hd)), perm=[0, 2, 1, 3])


def apply_rope(g: Graph, x: str, cos: str, sin: str) -> str:
    """Half-split RoPE on ``x`` [B, n, S, hd] with cos/sin broadcastable to [B, 1, S, hd/2]."""
    x1, x2 = g.ops("Split", [x], 2, axis=-1, num_outputs=2)
    r1 = g.op("Sub", g.op("Mul", x1, cos), g.op("Mul", x2, sin))
    r2 = g.op("Add", g.op("Mul", x2, cos), g.op("Mul", x1, sin))
    return g.op("Concat", r1, r2, axis=-1)


def grouped_attention(
    g: Graph, spec: ForgeSpec, q: str, keys: str, values: str, allowed: str
) -> str:
    """Softmax attention of q [B, H, S, hd] over keys/values [B, KV, T, hd] -> [B, S, H*hd].

    ``allowed`` is a bool mask broadcastable to [B, KV, group, S, T]. Query head h reads KV
    head h // group (GroupQueryAttention's mapping), done by reshaping, not by copying KV.
    """
    q5 = g.op("Reshape", q, g.i64(0, spec.kv_heads, spec.group, -1, spec.hd))
    k_t = g.op("Unsqueeze", g.op("Transpose", keys, perm=[0, 1, 3, 2]), g.i64(2))
    scores = g.op("Mul", g.op("MatMul", q5, k_t), g.f32(1.0 / math.sqrt(spec.hd)))
    lowest = g.f32(float(np.finfo(np.float32).min))
    probs = g.op("Softmax", g.op("Where", allowed, scores, lowest), axis=-1)
    ctx = g.op("MatMul", probs, g.op("Unsqueeze", values, g.i64(2)))
    ctx = g.op("Reshape", ctx, g.i64(0, spec.heads, -1, spec.hd))
    ctx = g.op("Transpose", ctx, perm=[0, 2, 1, 3])
    return g.op("Reshape", ctx, g.i64(0, 0, spec.q_dim))


def qkv_heads(
    g: Graph, spec: ForgeSpec, h: str, prefix: str, lw: LayerWeights
) -> tuple[str, str, str]:
    """Projections of ``h`` [B, S, hidden] -> q [B, H, S, hd], k and v [B, KV, S, hd]."""
    out = []
    for name, w, b, n in (
        ("q_proj", lw.q_w, lw.q_b, spec.heads),
        ("k_proj", lw.k_w, lw.k_b, spec.kv_heads),
        ("v_proj", lw.v_w, lw.v_b, spec.kv_heads),
    ):
        proj = g.op("MatMul", h, g.init(f"{prefix}.self_attn.{name}.weight", w))
        proj = g.op("Add", proj, g.init(f"{prefix}.self_attn.{name}.bias", b))
        out.append(heads_first(g, proj, n, spec.hd))
    return out[0], out[1], out[2]
