"""Give an onnxruntime-genai int4 export the GGUF's own weights back, bit for bit.

The onnxruntime-genai builder quantizes the fp32 weights it is given. When those came from
a GGUF, they are already quantized: SmolLM2's Q4_1 layers (blocks of 32, ``w = d*q + m``,
``q`` in 0..15, ``d`` and ``m`` fp16) and its Q8_0 tied embedding (``w = d*q``, ``q`` in
-127..127). Quantizing them a second time (symmetric int4, RTN) costs about a quarter in
held-out perplexity (the model card's table). This pass puts the original blocks back:

- Each layer ``MatMulNBits`` gets the Q4_1 codes ``q`` and scales ``d`` (and keeps its
  default zero point 8), so it computes ``sum_j d_j * ((q - 8) . x_j)``; the rest,
  ``sum_j (m_j + 8 d_j) * sum(x_j)``, is one small ``MatMul`` of the input's per-block
  sums by ``m + 8 d`` (``[blocks, N]``), added to the output. ``d`` and ``m`` are stored
  as fp16 (as in the GGUF) behind a ``Cast`` that ONNX Runtime folds when it loads the
  graph.
- With ``head8``, the tied embedding and LM head become 8-bit ``GatherBlockQuantized`` /
  ``MatMulNBits`` on the Q8_0 codes (one shared table); else the builder's int4 head stays.

The blocks are read back from the dequantized fp32 weights (``min`` of a Q4_1 block is
``m`` and its ``max`` is ``m + 15 d``; the largest ``|w|`` of a Q8_0 block is ``127 d``),
and every rebuilt block must equal its fp32 weight exactly, or the pass stops.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# the block formats are the engine's (engine/model/gguf_blocks.py: GGUF import uses them)
from engine.model.gguf_blocks import BLOCK, BlockWeight, NotExact, q4_1_blocks, q8_0_blocks
from engine.model.gguf_blocks import pack4 as _pack4

__all__ = ["NotExact", "make_exact", "q4_1_blocks", "q8_0_blocks"]


#: builder initializer stem -> the Hugging Face weights it holds, concatenated along N
def _sources(stem: str) -> list[str] | None:
    parts = stem.split(".")
    if stem.startswith("model.layers.") and len(parts) >= 5:
        layer, block, proj = parts[2], parts[3], parts[4]
        base = f"model.layers.{layer}"
        if block == "attn" and proj == "qkv_proj":
            return [f"{base}.self_attn.{p}_proj.weight" for p in "qkv"]
        if block == "attn":
            return [f"{base}.self_attn.{proj}.weight"]
        if block == "mlp":
            return [f"{base}.mlp.{proj}.weight"]
    return None


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.inits = {t.name: t for t in model.graph.initializer}
        self.sums: dict[tuple[str, int], str] = {}

    def add_init(self, array: np.ndarray, name: str) -> str:
        tensor = numpy_helper.from_array(array, name)
        if name in self.inits:
            self.inits[name].CopyFrom(tensor)
        else:
            self.model.graph.initializer.append(tensor)
            self.inits[name] = tensor
        return name

    def drop_init(self, name: str) -> None:
        tensor = self.inits.pop(name)
        self.model.graph.initializer.remove(tensor)

    def fp32_of_fp16(self, array: np.ndarray, name: str, out: list[onnx.NodeProto]) -> str:
        self.add_init(array.astype(np.float16), name + "_f16")
        out.append(helper.make_node("Cast", [name + "_f16"], [name], to=TensorProto.FLOAT,
                                    name=f"/exact/{name}/Cast"))
        return name

    def block_sums(self, x: str, blocks: int, out: list[onnx.NodeProto]) -> str:
        """``x`` ``[batch, seq, K]`` summed over each block of 32: ``[batch, seq, blocks]``."""
        key = (x, blocks)
        if key not in self.sums:
            tag = f"/exact/sums{len(self.sums)}"
            shape = self.add_init(np.array([0, 0, blocks, BLOCK], np.int64), tag + "/shape")
            axes = self.add_init(np.array([-1], np.int64), tag + "/axes")
            out.append(helper.make_node("Reshape", [x, shape], [tag + "/blocks"],
                                        name=tag + "/Reshape"))
            out.append(helper.make_node("ReduceSum", [tag + "/blocks", axes], [tag + "/out"],
                                        keepdims=0, name=tag + "/ReduceSum"))
            self.sums[key] = tag + "/out"
        return self.sums[key]


def _repack_layer(g: _Graph, node: onnx.NodeProto, blocks: BlockWeight) -> list[onnx.NodeProto]:
    """Nodes to run before ``node`` (sums, casts) and after it (the m term, the Add).

    ``node`` keeps its default zero point of 8 (a zero-point input costs MatMulNBits about
    a third more time here), so it computes ``d * (q - 8) . x``; the rest of each weight,
    ``m + 8 d``, goes in the small MatMul. ``m + 8 d`` is computed in fp32 from the two
    fp16 initializers by nodes ONNX Runtime folds at load, so it is exact.
    """
    before: list[onnx.NodeProto] = []
    x, w_name, s_name = node.input[0], node.input[1], node.input[2]
    nb = blocks.codes.shape[1]
    g.add_init(_pack4(blocks.codes), w_name)
    g.drop_init(s_name)
    g.fp32_of_fp16(blocks.scales, s_name, before)
    assert blocks.minimum is not None
    m = g.fp32_of_fp16(blocks.minimum, w_name + "_m", before)
    eight = g.add_init(np.array(8.0, np.float32), "/exact/eight")
    tag = node.name + "/exact"
    before += [
        helper.make_node("Mul", [s_name, eight], [tag + "/8d"], name=tag + "/Mul"),
        helper.make_node("Add", [m, tag + "/8d"], [tag + "/m8d"], name=tag + "/Add"),
        helper.make_node("Transpose", [tag + "/m8d"], [tag + "/offsets"], perm=[1, 0],
                         name=tag + "/Transpose"),
    ]
    sums = g.block_sums(x, nb, before)
    y = node.output[0]
    node.output[0] = y + "/without_offsets"
    after = [helper.make_node("MatMul", [sums, tag + "/offsets"], [y + "/offsets"],
                              name=tag + "/MatMul"),
             helper.make_node("Add", [y + "/without_offsets", y + "/offsets"], [y],
                              name=tag + "/AddOffsets")]
    return before + [node] + after


def _head8(g: _Graph, nodes: list[onnx.NodeProto], embed: np.ndarray) -> None:
    """The tied embedding / LM head on the Q8_0 codes: the LM head's ``MatMulNBits``
    reads them as ``[V, blocks, 32]``, the embedding's ``GatherBlockQuantized`` through the
    builder's ``Reshape`` as ``[V, K]`` (one table in the file), both with fp16 scales."""
    codes, d = q8_0_blocks(embed, "model.embed_tokens.weight")
    v, k = codes.shape
    head = next(n for n in nodes if n.op_type == "MatMulNBits"
                and n.input[1].startswith("lm_head."))
    gather = next(n for n in nodes if n.op_type == "GatherBlockQuantized")
    reshape = next(n for n in nodes if n.output[0] == gather.input[0])
    table, scales = head.input[1], head.input[2]
    g.add_init(codes.reshape(v, k // BLOCK, BLOCK), table)
    g.drop_init(scales)
    before: list[onnx.NodeProto] = []
    g.fp32_of_fp16(d, scales, before)
    _set_attr(head, "bits", 8)
    _set_attr(gather, "bits", 8)
    old_shape = reshape.input[1]
    reshape.input[1] = g.add_init(np.array([v, k], np.int64), "/exact/embed_q8/shape")
    if old_shape in g.inits and not any(old_shape in n.input for n in nodes):
        g.drop_init(old_shape)
    stale = [vi for vi in g.model.graph.value_info if vi.name == reshape.output[0]]
    for vi in stale:  # the builder recorded the 4-bit table's shape
        g.model.graph.value_info.remove(vi)
    nodes[:0] = before


def _set_attr(node: onnx.NodeProto, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))


def _matmuls(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            yield node


def make_exact(onnx_dir: Path, weights: dict[str, np.ndarray], head8: bool = False) -> dict[
        str, int]:
    """Rewrite ``onnx_dir/model.onnx`` (+ ``.data``) in place; returns what was replaced."""
    model = onnx.load(str(onnx_dir / "model.onnx"))
    g = _Graph(model)
    nodes: list[onnx.NodeProto] = []
    layers = 0
    for node in list(model.graph.node):
        stem = node.input[1].rsplit(".", 1)[0] if node.op_type == "MatMulNBits" else ""
        sources = _sources(stem) if stem else None
        if sources is None:
            nodes.append(node)
            continue
        w = np.concatenate([weights[s] for s in sources], axis=0)
        nodes.extend(_repack_layer(g, node, q4_1_blocks(w, stem)))
        layers += 1
    if head8:
        _head8(g, nodes, weights["model.embed_tokens.weight"])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    # (onnx.checker does not know the contrib ops; ONNX Runtime checks the graph at load)
    (onnx_dir / "model.onnx.data").unlink(missing_ok=True)
    onnx.save_model(model, str(onnx_dir / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data",
                    size_threshold=1024)
    return {"q4_1_matmuls": layers, "q8_0_head": int(head8)}
