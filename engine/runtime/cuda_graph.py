"""CUDA graph capture: opt-in, structurally gated, with the reason whenever it is declined.

ONNX Runtime's CUDA provider can capture a run into a CUDA graph (`enable_cuda_graph`) and
replay it, which removes the per-kernel launch cost of a decode step. Replay is only
correct when every step has the same shapes and the same device addresses, so capture is
attempted only when the model is structurally safe:

- the decode path is the fixed-capacity shared KV buffer (a growing KV changes shapes);
- the graph has no top-level `If` / `Loop` / `Scan` (data-dependent control flow);
- the model can be inspected at all (the scan reads the graph, never the weights): a
  model that cannot be read counts as unsafe;
- the provider is CUDA.

Capture is asked for by `EngineConfig.cuda_graph` or `ONNX_GENAI_CUDA_GRAPH=1`. A session
that ONNX Runtime refuses to build with capture (e.g. nodes left on the CPU) falls back to
eager decode; the reason is kept in `GraphCapture.reason` and shown by `describe()`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.errors import InvalidOptionError, ModelLoadError, RuntimeSelectionError
from engine.model.onnx_scan import ScanError, scan_onnx
from engine.runtime.providers import SessionInfo, make_session
from engine.runtime.runner import DeviceOptions

if TYPE_CHECKING:
    from engine.runtime.placement import Placement
    from engine.runtime.runner import DecodeRunner

log = logging.getLogger(__name__)

CUDA_GRAPH_ENV = "ONNX_GENAI_CUDA_GRAPH"
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class GraphCapture:
    """Whether decode steps replay a CUDA graph, and why not when they do not."""

    requested: bool
    enabled: bool
    #: Why capture is off although it was asked for (None when on or not asked for).
    reason: str | None = None

    def describe(self) -> dict[str, object]:
        return {"requested": self.requested, "enabled": self.enabled, "reason": self.reason}

    def failed(self, why: str) -> GraphCapture:
        """The same request after ONNX Runtime refused to capture: eager, with the reason."""
        return GraphCapture(self.requested, False, f"capture failed, decoding eagerly: {why}")


NOT_REQUESTED = GraphCapture(requested=False, enabled=False)


def capture_requested(configured: bool | None) -> bool:
    """The setting wins; unset, `ONNX_GENAI_CUDA_GRAPH` decides (default off)."""
    if configured is not None:
        return configured
    raw = os.environ.get(CUDA_GRAPH_ENV)
    if raw is None or not raw.strip():
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidOptionError(
        CUDA_GRAPH_ENV, f"expected one of {', '.join(_TRUE + _FALSE)}, got {raw!r}",
        hint="1 turns CUDA graph capture on, 0 (or unset) leaves it off")


def structural_declines(model_file: Path, decode_path: str) -> list[str]:
    """Why the graph is not safe to capture (empty when it is). Reads the structure only:
    `scan_onnx` walks the top-level graph and skips the weights."""
    try:
        scanned = scan_onnx(Path(model_file))
    except (ScanError, OSError) as exc:
        return [f"cannot inspect the model ({exc}): counted as having control flow"]
    reasons = []
    found = [op for op in CONTROL_FLOW_OPS if op in scanned.op_types]
    if found:
        reasons.append(f"has {', '.join(found)} (top-level control flow)")
    if decode_path != "shared_buffer":
        reasons.append(f"dynamic shapes: the {decode_path} KV path changes shapes every "
                       "step (capture needs a fixed-capacity shared buffer)")
    return reasons


def decide_capture(requested: bool, provider: str, model_file: Path,
                   decode_path: str) -> GraphCapture:
    """The gate: capture only when asked for, structurally safe, and on CUDA."""
    if not requested:
        return NOT_REQUESTED
    reasons = structural_declines(model_file, decode_path)
    if provider != "cuda":
        reasons.append(f"not CUDA (provider {provider})")
    if reasons:
        return GraphCapture(True, False, "; ".join(reasons))
    return GraphCapture(True, True)


def graph_provider_options(capture: GraphCapture) -> dict[str, str]:
    """CUDA provider options that turn capture on (empty when it is off)."""
    return {"enable_cuda_graph": "1"} if capture.enabled else {}


def open_session(model_file: Path, config: EngineConfig, placement: Placement,
                 decode_path: str, graph: bytes | None = None
                 ) -> tuple[Any, SessionInfo, GraphCapture]:
    """The model's session, with CUDA graph capture when asked for and safe; a session ONNX
    Runtime will not build with capture is rebuilt without it (the reason is kept)."""
    provider = placement.provider if placement.provider != "auto" else "cpu"
    capture = decide_capture(capture_requested(config.cuda_graph), provider, model_file,
                             decode_path)
    if capture.requested and not capture.enabled:
        log.warning("CUDA graph capture declined: %s", capture.reason)
    if capture.enabled:
        options = {**placement.provider_options, **graph_provider_options(capture)}
        try:
            session, info = make_session(model_file, config, provider=placement.provider,
                                         provider_options=options, graph=graph)
            return session, info, capture
        except (ModelLoadError, RuntimeSelectionError) as exc:
            capture = capture.failed(str(exc))
            log.warning("%s", capture.reason)
    session, info = make_session(model_file, config, provider=placement.provider,
                                 provider_options=placement.provider_options, graph=graph)
    return session, info, capture


def device_options(device_kv: bool | None, provider: str, decode_path: str,
                   capture: GraphCapture) -> DeviceOptions | None:
    """Device-resident KV: by default on CUDA for shared-buffer graphs; `device_kv=True`
    forces the same code path on the CPU (tests), False turns it off."""
    wanted = device_kv if device_kv is not None else provider == "cuda"
    if not wanted or decode_path != "shared_buffer":
        return None
    device = "cuda" if provider == "cuda" else "cpu"
    return DeviceOptions(device, static_shapes=capture.enabled, graph=capture.enabled)


def describe_device(capture: GraphCapture, runner: DecodeRunner) -> dict[str, object]:
    """What `Engine.describe()` says about device execution: capture and where KV lives."""
    from engine.runtime.decode_device import DeviceRunner

    info = capture.describe()
    runner = runner.kv_runner  # a window's runner holds its KV in the one inside
    if isinstance(runner, DeviceRunner):
        if runner.capture_failure is not None:
            info = capture.failed(runner.capture_failure).describe()
        return {"cuda_graph": info, "kv_device": runner.kv_device.lower(),
                "greedy_on_device": True}
    return {"cuda_graph": info, "kv_device": "cpu", "greedy_on_device": False}
