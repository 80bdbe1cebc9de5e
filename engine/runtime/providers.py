"""ONNX Runtime: the installed variant, execution providers, session options."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from engine import kernels
from engine.config import EngineConfig
from engine.errors import InvalidOptionError, ModelLoadError, RuntimeSelectionError
from engine.kernels import KernelUse
from engine.memory.governor import governor_for
from engine.model.graph_passes import LOGITS_TO_KEEP, keep_last_logits, own_attention_moves
from engine.model.io_spec import IOSpec
from engine.model.kv16_pass import cache_kv, row_extra
from engine.model.matmul_pass import own_matmul_moves
from engine.sizes import format_bytes, parse_limit

log = logging.getLogger(__name__)

#: Distributions that all install the `onnxruntime` import package.
ORT_VARIANTS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml",
                "onnxruntime-openvino", "onnxruntime-qnn")
_PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                   "directml": "DmlExecutionProvider"}
BACKEND_ENV = "ONNX_GENAI_BACKEND"

# ONNX Runtime (1.32, on Linux too) writes a telemetry database and a device id under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime when it creates its first session. A
# local, offline engine leaves the user's home alone: off unless the user set the variable.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def installed_ort_variants() -> list[str]:
    found = []
    for name in ORT_VARIANTS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_ort_installation(variants: list[str] | None = None) -> str:
    """Return the one installed ONNX Runtime variant, or explain how to fix the install."""
    found = installed_ort_variants() if variants is None else variants
    if not found:
        raise RuntimeSelectionError(
            "ONNX Runtime is not installed",
            hint="install exactly one extra: pip install '.[cpu]' (or [cuda], or [directml] "
                 "on Windows)")
    if len(found) > 1:
        raise RuntimeSelectionError(
            f"several ONNX Runtime variants are installed ({', '.join(found)}); they share "
            "the import name 'onnxruntime' and overwrite each other's files",
            hint=f"pip uninstall -y {' '.join(found)}, then install exactly one extra")
    return found[0]


def provider_from_env(configured: str) -> str:
    """An explicit provider wins; 'auto' honours ONNX_GENAI_BACKEND when it is set."""
    if configured != "auto":
        return configured
    raw = os.environ.get(BACKEND_ENV)
    if raw is None or not raw.strip():
        return "auto"
    value = raw.strip().lower()
    if value not in ("auto", *_PROVIDER_NAMES):
        raise RuntimeSelectionError(
            f"{BACKEND_ENV}={raw!r} is not a known provider",
            hint=f"use one of auto, {', '.join(_PROVIDER_NAMES)} or unset it")
    return value


def choose_providers(requested: str, available: list[str]) -> list[str]:
    """ORT provider list for a request; refuse a provider that is not installed."""
    if requested == "auto":
        for key in ("cuda", "directml"):
            if _PROVIDER_NAMES[key] in available:
                return [_PROVIDER_NAMES[key], "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]
    name = _PROVIDER_NAMES[requested]
    if name not in available:
        extra = {"cuda": "cuda", "directml": "directml"}.get(requested, "cpu")
        raise RuntimeSelectionError(
            f"provider '{requested}' is not available in this ONNX Runtime "
            f"(available: {', '.join(available)})",
            hint=f"install the '{extra}' extra instead of the current variant, or use "
                 "--provider cpu")
    return [name] if requested == "cpu" else [name, "CPUExecutionProvider"]


def default_threads() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class SessionInfo:
    provider: str
    threads: int


def available_providers() -> list[str]:
    import onnxruntime as ort

    check_ort_installation()
    return list(ort.get_available_providers())


def make_session(model_file: Path, config: EngineConfig, *, provider: str | None = None,
                 provider_options: dict[str, str] | None = None,
                 graph: bytes | None = None) -> tuple[Any, SessionInfo]:
    """An ORT session; `provider` (after placement) overrides the configured one. `graph`
    is the model rewritten at load (engine.model.graph_passes): ONNX Runtime builds it
    instead of the file, with the weights still read from the file's folder."""
    import onnxruntime as ort

    requested = provider or provider_from_env(config.provider)
    names = choose_providers(requested, available_providers())
    providers: list[Any] = [(n, provider_options) if provider_options and n != names[-1]
                            else n for n in names]
    options = ort.SessionOptions()
    threads = config.intra_op_threads or default_threads()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = config.spin_duration_us
    for pool in ("intra_op", "inter_op"):
        options.add_session_config_entry(f"session.{pool}.allow_spinning",
                                         "0" if spin == 0 else "1")
        if spin:  # a bounded spin keeps ops fast inside a run yet idles within `spin` µs
            options.add_session_config_entry(f"session.{pool}.spin_duration_us", str(spin))
    options.log_severity_level = 3
    if graph is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(model_file.parent))
        library = kernels.library()
        if library is not None and kernels.status().ready:  # the graph may use them
            options.register_custom_ops_library(str(library))
    try:
        session = ort.InferenceSession(graph if graph is not None else str(model_file),
                                       options, providers=providers)
    except Exception as exc:  # ORT raises several unrelated types for a bad graph
        other = "cpu" if requested != "cpu" else "cuda (install the 'cuda' extra)"
        raise ModelLoadError(
            f"ONNX Runtime could not load {model_file}: {exc}",
            hint=f"check the ONNX Runtime version (this model may need a newer one), or try "
                 f"another provider: --provider {other}") from exc
    active = session.get_providers()[0]
    if requested not in ("auto", "cpu") and active != _PROVIDER_NAMES[requested]:
        raise RuntimeSelectionError(
            f"asked for {requested} but ONNX Runtime runs on {active}",
            hint="check the GPU driver and CUDA/cuDNN libraries, or use --provider cpu")
    short = {v: k for k, v in _PROVIDER_NAMES.items()}.get(active, active)
    return session, SessionInfo(provider=short, threads=threads)


@dataclass(frozen=True)
class KVRoom:
    """What a memory limit leaves for KV beside the weights, and the context it must hold."""

    bytes: int
    context: int


def kv_room(config: EngineConfig, weights_bytes: int, context: int) -> KVRoom | None:
    """What a memory limit set for host RAM leaves for the KV of a CPU model beside its
    weights, and the context it is for (None without such a limit: "auto")."""
    if parse_limit(config.host_ram_limit, field="host_ram_limit").kind == "auto":
        return None
    budget = governor_for(config, "cpu", 1, weights_bytes).budget()
    if budget is None or budget.kv_bytes is None:
        return None
    return KVRoom(budget.kv_bytes, context)


def int8_chosen(config: EngineConfig, room: KVRoom | None, float16_per_token: int) -> bool:
    """Whether the KV is int8: asked for, or "auto" under a memory limit whose room holds
    less than the context in 16 bits (int8 holds about twice as many tokens)."""
    if config.kv_dtype == "int8":
        return True
    return config.kv_dtype == "auto" and room is not None and kernels.i8kv_ready() and \
        room.context * float16_per_token > room.bytes


def sixteen_bit(config: EngineConfig, head_dims: list[int]) -> str:
    """The 16-bit KV element the engine keeps: "int16" where asked for, or with "auto"
    where the kernel runs it on VPDPWSSD (AVX-512 VNNI, or AVX-VNNI on 256-bit registers)
    without AMX and every head is a multiple of 32 (kernels.i16kv_preferred; its attention
    then runs on whole numbers: a 512-token chunk after 5,552 positions 0.66-0.70x, a decode
    step after 8,000 0.65-0.86x of float16's time on Zen 5; the 256-bit code against
    float16's AVX2 code 0.59x and 0.73x, engine/README.md); else "float16"."""
    if config.kv_dtype == "int16":
        return "int16"
    if config.kv_dtype == "auto" and head_dims and all(d % 32 == 0 for d in head_dims) \
            and kernels.i16kv_preferred():
        return "int16"
    return "float16"


def pruned_graph(model_file: Path, spec: IOSpec, config: EngineConfig, provider: str,
                 attention_nodes: int, matmul_nodes: int = 0, kv_room: KVRoom | None = None
                 ) -> tuple[bytes | None, IOSpec, KernelUse]:
    """The model rewritten at load for the CPU (engine.model.graph_passes): a prefill
    computes the logits it needs only, GroupQueryAttention runs the engine's kernel
    (engine.kernels) where it was built, over a float16 KV cache where `config.kv_dtype`
    allows (engine.model.kv16_pass); with the spec that binds the new input and the KV's
    element type, and what became of the graph's `attention_nodes` GroupQueryAttention and
    `matmul_nodes` MatMulNBits nodes (engine.model.matmul_pass); with `kv_dtype` "auto"
    and a memory limit whose `kv_room` holds less than the context at float16, int8 KV.
    (None, spec, ...)
    when both are off or do not apply, or when a GPU provider may run it (the new input is
    a host tensor, untried inside a captured CUDA graph)."""
    graph, spec, use = _pruned_graph(model_file, spec, config, provider, attention_nodes,
                                     matmul_nodes, kv_room)
    asked = config.kv_dtype
    if asked in ("float16", "int8", "int16") and spec.kv_pairs and use.kv_dtype != asked:
        raise InvalidOptionError(
            "kv_dtype", f"a{'n' if asked.startswith('int') else ''} {asked} KV cache cannot "
            f"be kept for {model_file.parent.name}: {use.kv_reason}", hint="use kv_dtype "
            "'auto' (--kv-dtype auto): 16 bits where it applies, else the model's own")
    return graph, spec, use


def _pruned_graph(model_file: Path, spec: IOSpec, config: EngineConfig, provider: str,
                  attention_nodes: int, matmul_nodes: int, kv_room: KVRoom | None
                  ) -> tuple[bytes | None, IOSpec, KernelUse]:
    status = kernels.status()
    names = choose_providers(provider, available_providers())
    if names != ["CPUExecutionProvider"]:
        short = {v: k for k, v in _PROVIDER_NAMES.items()}.get(names[0], names[0])
        why = f"runs on {short}, the kernel is for the CPU"
        return None, spec, _with_kv(_kept(status, attention_nodes, why, matmul_nodes), spec,
                                    why)
    own = config.own_kernels and status.ready
    if not own:
        why = "turned off by own_kernels=False" if not config.own_kernels \
            else _NOT_READY[status.state]
        use = _with_kv(_kept(status, attention_nodes, why, matmul_nodes), spec, why)
        if not config.prune_logits:
            return None, spec, use
    data = model_file.read_bytes()
    graph = keep_last_logits(data, spec.logits) if config.prune_logits else None
    if graph is not None:
        spec = dataclasses.replace(spec, logits_to_keep=LOGITS_TO_KEEP)
    if own:
        moved, nodes, kept = own_attention_moves(graph if graph is not None else data)
        graph = moved or graph
        use = KernelUse(status, nodes, nodes - sum(kept.values()), kept) if nodes or not kept \
            else _kept(status, attention_nodes, next(iter(kept)))  # the graph was unreadable
        slow = kernels.matmul_slow_reason() if kernels.matmul_on() else None
        if kernels.matmul_on() and slow is None:
            moved, nodes, kept = own_matmul_moves(graph if graph is not None else data,
                                                  eight_bit=kernels.matmul_eight_bit(),
                                                  fp32=kernels.matmul_fp32_fast())
            graph = moved or graph
            nodes = nodes if nodes or not kept else matmul_nodes
        else:
            nodes, kept = matmul_nodes, Counter({slow or _MATMUL_OFF: matmul_nodes})
        use = dataclasses.replace(use, matmul_nodes=nodes, matmul_kept=kept,
                                  matmul_moved=nodes - sum(kept.values()) if nodes else 0)
        graph, spec, kv_why = _small_kv(graph, spec, config, use, kv_room)
        use = _with_kv(use, spec, kv_why)
    return graph, spec, use


def _small_kv(graph: bytes | None, spec: IOSpec, config: EngineConfig, use: KernelUse,
              kv_room: KVRoom | None = None) -> tuple[bytes | None, IOSpec, str | None]:
    """The graph and spec with a 16-bit KV cache (int16 or float16: `sixteen_bit`; int8
    asked for or under a memory limit) (engine.model.kv16_pass), or as they were and why
    not."""
    if not spec.kv_pairs or any(p.dtype != "float32" for p in spec.kv_pairs):
        return graph, spec, None
    if config.kv_dtype == "float32":
        return graph, spec, "kv_dtype float32 asked for"
    if graph is None or not use.moved:
        return graph, spec, "no attention node runs the engine's kernel"
    wide = sixteen_bit(config, [p.head_dim for p in spec.kv_pairs])
    per_token = sum(p.num_heads * (p.head_dim + row_extra(wide)) * 2 for p in spec.kv_pairs)
    element = "int8" if int8_chosen(config, kv_room, per_token) else wide
    chosen = None
    if element == "int8" and config.kv_dtype == "auto" and kv_room is not None:
        chosen = (f"the memory limit leaves {format_bytes(kv_room.bytes)} for KV: "
                  f"{kv_room.bytes // per_token} {wide} tokens of the context's "
                  f"{kv_room.context}")
    ready = {"int8": kernels.i8kv_ready, "int16": kernels.i16kv_ready}
    if not ready.get(element, kernels.f16kv_ready)():
        return graph, spec, f"the kernels' library predates the {element}-KV attention; " + \
            _REINSTALL_WORDS
    dims = {name: p.head_dim for p in spec.kv_pairs for name in (p.input, p.output)}
    cached, why = cache_kv(graph, element, dims)
    if cached is None:
        return graph, spec, why
    extra = row_extra(element)
    pairs = tuple(dataclasses.replace(p, dtype=element, head_dim=p.head_dim + extra)
                  for p in spec.kv_pairs)
    return cached, dataclasses.replace(spec, kv_pairs=pairs), chosen


_REINSTALL_WORDS = "re-run the install to rebuild it"


def _with_kv(use: KernelUse, spec: IOSpec, why: str | None) -> KernelUse:
    """`use` with the KV cache's element type, and why it is not 16-bit."""
    if not spec.kv_pairs:
        return use
    dtype = spec.kv_pairs[0].dtype
    return dataclasses.replace(use, kv_dtype=dtype, kv_reason=why if dtype not in
                               ("float16", "int16") else None)


_MATMUL_OFF = f"turned off by {kernels.MATMUL_ENV}=0"
_NOT_READY = {"off": "turned off by ONNX_GENAI_KERNELS=0", "not built": "the kernel is not built",
              "cannot load": "the kernel cannot be loaded"}


def log_kernel_use(model: str, use: KernelUse) -> None:
    """The load's line on the engine's kernel: a warning where it would run but cannot (not
    built, or not loadable: decode is slower at long prompts), else information."""
    missing = use.kept.keys() & {_NOT_READY["not built"], _NOT_READY["cannot load"]}
    log.log(logging.WARNING if missing else logging.INFO, "model %s: %s (%s)", model,
            use.line(), use.status.line())
    if use.kv_line():
        log.info("model %s: %s", model, use.kv_line())


def _kept(status: kernels.KernelStatus, nodes: int, why: str, matmuls: int = 0) -> KernelUse:
    return KernelUse(status, nodes, 0, Counter({why: nodes}) if nodes else Counter(),
                     matmuls, 0, Counter({why: matmuls}) if matmuls else Counter())
