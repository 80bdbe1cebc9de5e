"""What a model's graph says, read without its weights: the operators and their counts,
quantization, control flow, the inputs and outputs, the attention's shape, and whether
every external data file is there and long enough (`scan_graph`). The model folder
(`engine.model.model_dir`) checks its metadata against this summary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError
from engine.model.io_spec import TensorSpec
from engine.model.onnx_scan import ScanError, ScannedModel, scan_onnx

_CONTROL_FLOW = {"If", "Loop", "Scan"}

@dataclass(frozen=True)
class ExternalData:
    path: Path
    size: int
    #: Bytes the graph reads from the file (max offset + length).
    expected: int


@dataclass(frozen=True)
class AttentionShape:
    """What the graph's GroupQueryAttention nodes fix, whatever the metadata says."""

    layers: int
    num_heads: int
    kv_num_heads: int
    #: The width of the attention's output over its heads (from the output projection's
    #: weight); None when that projection is not a plain or int4 MatMul.
    head_size: int | None
    #: Positions the rotary table (``cos_cache``) covers; None without one.
    rotary_positions: int | None


@dataclass(frozen=True)
class GraphSummary:
    op_counts: Mapping[str, int]
    has_gqa: bool
    quantization: str
    top_level_control_flow: bool
    inline_weights_bytes: int
    external_data: tuple[ExternalData, ...]
    opset: int
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    attention: AttentionShape | None = None


def _attention_shape(scanned: ScannedModel) -> AttentionShape | None:
    """The GroupQueryAttention nodes' heads, head size and rotary table (None without GQA,
    or when the layers disagree among themselves)."""
    attention = [n for n in scanned.nodes if n.op_type == "GroupQueryAttention"]
    if not attention:
        return None
    heads = {(n.ints.get("num_heads"), n.ints.get("kv_num_heads")) for n in attention}
    if len(heads) != 1:
        return None
    ((num_heads, kv_num_heads),) = heads
    if not num_heads or not kv_num_heads:
        return None
    dims = {t.name: t.dims for t in scanned.initializers}
    consumers = {n.inputs[0]: n for n in scanned.nodes
                 if n.op_type in ("MatMul", "MatMulNBits") and n.inputs}
    widths: set[int | None] = set()
    for node in attention:
        projection = consumers.get(node.outputs[0]) if node.outputs else None
        if projection is None:
            widths.add(None)
        elif projection.op_type == "MatMulNBits":
            widths.add(projection.ints.get("K"))
        else:
            weight = dims.get(projection.inputs[1]) if len(projection.inputs) > 1 else None
            widths.add(weight[0] if weight and len(weight) == 2 else None)
    width = widths.pop() if len(widths) == 1 else None
    head_size = width // num_heads if width and width % num_heads == 0 else None
    rotary = None
    first = attention[0]
    if first.ints.get("do_rotary") and len(first.inputs) > 7:
        table = dims.get(first.inputs[7])
        rotary = table[0] if table and len(table) == 2 else None
    return AttentionShape(layers=len(attention), num_heads=num_heads,
                          kv_num_heads=kv_num_heads, head_size=head_size,
                          rotary_positions=rotary)


def scan_graph(model_file: Path) -> GraphSummary:
    """Read the graph structure (not the weights) and check external data files."""
    if not model_file.is_file():
        raise ModelLoadError(f"model file {model_file} is missing",
                             hint="re-download the model folder; the .onnx file is required")
    try:
        scanned = scan_onnx(model_file)
    except (ScanError, OSError) as exc:
        raise ModelLoadError(
            f"{model_file} is not a readable ONNX model ({exc}); the file may be truncated",
            hint="re-download the model; compare its size with the source") from exc
    if not scanned.op_types:
        raise ModelLoadError(f"{model_file} holds an empty graph (truncated download?)",
                             hint="re-download the model file")
    ops = Counter(scanned.op_types)
    inline = 0
    expected: dict[str, int] = {}
    for tensor in scanned.initializers:
        if tensor.data_location == 1:  # EXTERNAL
            entry = tensor.external
            end = int(entry.get("offset", 0)) + int(entry.get("length", 0))
            loc = entry.get("location", "")
            expected[loc] = max(expected.get(loc, 0), end)
        else:
            inline += tensor.size
    externals = []
    for loc, need in sorted(expected.items()):
        data_path = model_file.parent / loc
        if not data_path.is_file():
            raise ModelLoadError(
                f"{model_file.name} needs external data file '{loc}', which is missing from "
                f"{model_file.parent}", hint=f"download '{loc}' into the model folder")
        size = data_path.stat().st_size
        if size < need:
            raise ModelLoadError(
                f"external data file {data_path} is truncated: the graph reads {need} bytes, "
                f"the file has {size}", hint=f"re-download '{loc}'")
        externals.append(ExternalData(data_path, size, need))
    quant = "int4" if "MatMulNBits" in ops else (
        "int8" if {"MatMulInteger", "DynamicQuantizeLinear", "QLinearMatMul"} & set(ops)
        else "none")
    initialized = {t.name for t in scanned.initializers}
    return GraphSummary(
        op_counts=dict(ops), has_gqa="GroupQueryAttention" in ops, quantization=quant,
        top_level_control_flow=bool(_CONTROL_FLOW & set(ops)), inline_weights_bytes=inline,
        external_data=tuple(externals), opset=scanned.opsets.get("ai.onnx", 0),
        inputs={v.name: TensorSpec(v.name, v.dtype, tuple(v.shape))
                for v in scanned.inputs if v.name not in initialized},
        outputs={v.name: TensorSpec(v.name, v.dtype, tuple(v.shape)) for v in scanned.outputs},
        attention=_attention_shape(scanned),
    )
