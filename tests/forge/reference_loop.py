"""Independent greedy oracles for forged (and real) model folders.

``reference_greedy`` uses plain ``InferenceSession.run`` with numpy feeds and no KV reuse:
each step re-runs the whole sequence from an empty past and takes the argmax of the last
position. ``og_greedy`` runs onnxruntime-genai with EOS ignored (min_length = max_length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import yaml

GENAI, OPTIMUM, STATIC = "genai", "optimum", "static"


@dataclass(frozen=True)
class Layout:
    kind: str
    model_file: Path
    head_size: int | None = None  # genai: fills the symbolic ``kv_cache_dim``


def detect_layout(model_dir: Path) -> Layout:
    """Which of the three layouts ``model_dir`` holds, from the files present."""
    model_dir = Path(model_dir)
    if (model_dir / "genai_config.json").is_file():
        decoder = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
        return Layout(GENAI, model_dir / decoder["filename"], int(decoder["head_size"]))
    if (model_dir / "inference_metadata.yaml").is_file():
        meta = yaml.safe_load((model_dir / "inference_metadata.yaml").read_text())
        return Layout(STATIC, model_dir / meta.get("model_file", "model.onnx"))
    if (model_dir / "config.json").is_file():
        return Layout(OPTIMUM, model_dir / "model.onnx")
    raise FileNotFoundError(
        f"{model_dir}: expected genai_config.json, inference_metadata.yaml or config.json"
    )


def _session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _past_shape(dims: list[int | str | None], layout: Layout) -> tuple[int, ...]:
    """Concrete shape of an empty past: batch 1, length 0 (static: the full fixed cache)."""
    shape = []
    for axis, dim in enumerate(dims):
        if isinstance(dim, int):
            shape.append(dim)
        elif axis == 0:
            shape.append(1)
        elif axis == 3 and layout.head_size is not None:
            shape.append(layout.head_size)
        else:
            shape.append(0)
    return tuple(shape)


def _feeds(sess: ort.InferenceSession, layout: Layout, ids: list[int]) -> dict[str, np.ndarray]:
    n = len(ids)
    feeds: dict[str, np.ndarray] = {}
    for inp in sess.get_inputs():
        if inp.name == "input_ids":
            feeds[inp.name] = np.array([ids], np.int64)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.arange(n, dtype=np.int64)[None, :]
        elif inp.name == "attention_mask":
            width = inp.shape[1] if layout.kind == STATIC else n
            if n > width:
                raise ValueError(f"sequence of {n} tokens exceeds the static cache ({width})")
            mask = np.zeros((1, width), np.int64)
            mask[0, :n] = 1
            feeds[inp.name] = mask
        elif inp.name.startswith("past_key_values."):
            feeds[inp.name] = np.zeros(_past_shape(list(inp.shape), layout), np.float32)
        else:
            raise ValueError(f"reference_greedy does not know how to feed input {inp.name!r}")
    return feeds


def reference_greedy(
    model_dir: Path, prompt_ids: list[int], n: int, *, threads: int = 1
) -> list[int]:
    """``n`` greedy tokens after ``prompt_ids``, recomputing the full sequence every step."""
    layout = detect_layout(Path(model_dir))
    sess = _session(layout.model_file, threads)
    ids = [int(t) for t in prompt_ids]
    out: list[int] = []
    for _ in range(n):
        logits = sess.run(["logits"], _feeds(sess, layout, ids))[0]
        token = int(np.argmax(logits[0, -1]))
        out.append(token)
        ids.append(token)
    return out


def reference_logits(model_dir: Path, ids: list[int], *, threads: int = 1) -> np.ndarray:
    """Logits ``[len(ids) or 1, vocab]`` of one full, cache-free pass over ``ids``."""
    layout = detect_layout(Path(model_dir))
    sess = _session(layout.model_file, threads)
    logits: np.ndarray = sess.run(["logits"], _feeds(sess, layout, list(ids)))[0][0]
    return logits


def og_greedy(model_dir: Path, prompt_ids: list[int], n: int, threads: int = 1) -> list[int]:
    """``n`` greedy tokens from onnxruntime-genai (EOS ignored: min_length = max_length)."""
    from tests.peers import onnxruntime_genai

    og = onnxruntime_genai()
    config = og.Config(str(model_dir))
    overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
    config.overlay(json.dumps(overlay))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    total = len(prompt_ids) + n
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(prompt_ids, np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    sequence = [int(t) for t in generator.get_sequence(0)]
    return sequence[len(prompt_ids) :]
