"""Targets that expose hidden states, and tiny proposer heads, for speculative contracts.

`write_hidden_target` writes the optimum layout (same weights, same tokens as
`write_optimum_model`) with extra graph outputs tapped from the residual stream and our own
`inference_metadata.yaml`. `write_head` writes a small graph with the given inputs and
outputs (MTP, EAGLE-3 or shared-KV assistant I/O); `write_f32` a raw float32 weight file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from onnx import TensorProto, helper

from tests.forge.common import ForgeSpec, Graph, tensor_info, write_tokenizer_for
from tests.forge.optimum import _io, build_optimum_graph
from tests.forge.tokenizer import EOS_TOKEN_ID

#: Output name -> (layer tapped, -1 = final normed hidden; numpy dtype of the output).
Taps = Mapping[str, tuple[int, str]]

DEFAULT_TAPS: Taps = {"hidden_states": (-1, "float32")}


def write_hidden_target(out_dir: Path, spec: ForgeSpec = ForgeSpec(),  # noqa: B008
                        *, taps: Taps = DEFAULT_TAPS,
                        speculative: Mapping[str, Any] | None = None,
                        hidden_output: str | None = "hidden_states",
                        kv_cache: bool = True) -> Path:
    """A metadata-format model folder whose graph also outputs the tapped hidden states
    (without `kv_cache`: no past/present KV, the engine's recompute path)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_layer: dict[int, str] = {}
    casts: list[tuple[str, str, str]] = []  # raw tap, output name, dtype
    for name, (layer, dtype) in taps.items():
        raw = by_layer.setdefault(layer, f"tap.{layer}")
        casts.append((raw, name, dtype))
    g = build_optimum_graph(spec, {layer: raw for layer, raw in by_layer.items()},
                            kv_cache=kv_cache)
    inputs, outputs = _io(spec, kv_cache)
    for raw, name, dtype in casts:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype != "bfloat16" \
            else TensorProto.BFLOAT16
        g.op("Cast", raw, out=name, to=elem)
        outputs.append(tensor_info(name, elem, ["batch_size", "sequence_length", spec.hidden]))
    g.save(out_dir / "model.onnx", inputs, outputs, external_data=False)
    meta: dict[str, Any] = {"inference_metadata_version": 1, "model_file": "model.onnx",
                            "max_sequence_length": spec.context,
                            "eos_token_ids": [EOS_TOKEN_ID], "bos_token_id": EOS_TOKEN_ID,
                            "io": {"hidden_output": hidden_output} if hidden_output else {}}
    if speculative is not None:
        meta["speculative"] = dict(speculative)
    (out_dir / "inference_metadata.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    write_tokenizer_for(out_dir, spec, None)
    return out_dir


def write_head(path: Path, inputs: Mapping[str, Sequence[int | str]],
               outputs: Mapping[str, int], seed: int = 0,
               weights: Mapping[str, np.ndarray] | None = None) -> Path:
    """A head graph: its rank-3 float inputs are concatenated on the last axis and each
    output is a projection of that to the given width (random, or `weights[output]`);
    other inputs (KV) are declared only."""
    rng = np.random.default_rng(seed)
    weights = weights or {}
    g = Graph("forge_head")
    feats = [name for name, shape in inputs.items() if len(shape) == 3]
    x = feats[0] if len(feats) == 1 else g.op("Concat", *feats, axis=-1)
    width = sum(int(inputs[name][-1]) for name in feats)
    for name, out in outputs.items():
        w = weights.get(name)
        if w is None:
            w = (rng.standard_normal((width, out)) / np.sqrt(width)).astype(np.float32)
        g.op("MatMul", x, g.init(f"{name}.weight", w), out=name)
    f32 = TensorProto.FLOAT
    path.parent.mkdir(parents=True, exist_ok=True)
    return g.save(path, [tensor_info(n, f32, list(s)) for n, s in inputs.items()],
                  [tensor_info(n, f32, ["batch", "seq", d]) for n, d in outputs.items()],
                  external_data=False)


def write_f32(path: Path, rows: int, cols: int, *, extra_bytes: int = 0, seed: int = 0) -> Path:
    """A raw little-endian float32 [rows, cols] matrix (plus `extra_bytes` of garbage)."""
    data = np.random.default_rng(seed).standard_normal((rows, cols)).astype("<f4")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.tobytes() + b"\0" * extra_bytes)
    return path
