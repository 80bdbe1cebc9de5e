"""The steps of a load, in order: read the model folder (its metadata checked against the
graph), its tokenizer, the graph's input and output roles, a declared speculative head;
choose where it runs (the provider and its memory limit); rewrite the graph for the CPU
where that helps; open the ONNX Runtime session (with CUDA graph capture when asked and
safe). `Engine.load` (engine/engine.py) builds the engine on what this opens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.generation.spec_heads import DeclaredHead, load_declared_head
from engine.kernels import KernelUse
from engine.memory.limits import parse_limit
from engine.model.io_spec import IOSpec, resolve_io
from engine.model.model_dir import ModelDir, load_model_dir
from engine.runtime.cuda_graph import GraphCapture, open_session
from engine.runtime.placement import Placement, plan_placement
from engine.runtime.providers import (
    SessionInfo,
    available_providers,
    kv_room,
    log_kernel_use,
    provider_from_env,
    pruned_graph,
)
from engine.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenedModel:
    """A model folder opened for an engine: what was read, where it runs, its session."""

    model: ModelDir
    tokenizer: Tokenizer
    spec: IOSpec
    #: A model-declared speculative head that passed its contract checks (None: none).
    head: DeclaredHead | None
    placement: Placement
    #: What the graph's GroupQueryAttention nodes run (engine.kernels).
    kernel_use: KernelUse
    session: Any
    info: SessionInfo
    capture: GraphCapture


def open_model(model_dir: str | Path, config: EngineConfig) -> OpenedModel:
    """Read, place and open ``model_dir`` for ``config``; errors name the file and the fix."""
    model = load_model_dir(model_dir)
    tokenizer = Tokenizer.from_dir(model.path)
    spec = resolve_io(model.graph.inputs, model.graph.outputs, model.declared,
                      has_gqa=model.graph.has_gqa, source=model.format)
    head = load_declared_head(model, spec, config.speculative_head)
    placement = plan_placement(
        provider_from_env(config.provider), available_providers(), model.weights_bytes,
        parse_limit(config.vram_limit, field="vram_limit"))
    if placement.reason:
        log.warning("%s", placement.reason)
    graph, spec, kernel_use = pruned_graph(
        model.model_file, spec, config, placement.provider,
        model.graph.op_counts.get("GroupQueryAttention", 0),
        model.graph.op_counts.get("MatMulNBits", 0), kv_room=kv_room(
            config, model.weights_bytes,
            min(config.kv_max_len or model.context_length, model.context_length)))
    log_kernel_use(model.path.name, kernel_use)
    session, info, capture = open_session(model.model_file, config, placement,
                                          spec.decode_path, graph)
    return OpenedModel(model, tokenizer, spec, head, placement, kernel_use, session, info, capture)
