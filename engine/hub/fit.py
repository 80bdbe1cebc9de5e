"""Will a model fit on this machine? The catalog's label per model and quantization.

The question is the one the engine asks when it loads a model: the Resource Governor's own
budget (:func:`engine.memory.governor.governor_for`) for the weights and the KV page of
the model's shape, under the limits of the engine configuration, on the provider the
engine's placement would choose. The answer is one of

- ``fits``: the weights and the KV of the whole default context fit under the limit;
- ``fits with a shorter context (N tokens)``: the weights fit, the KV of N < context
  tokens does (the governor refuses to grow KV beyond it);
- ``too big``: the weights leave no KV page; the governor refuses the load with the same
  figures (its ``refusal``).

Weights: the sizes of the repository's files (ONNX: ``.onnx`` and external data). A GGUF
is converted on download; its weights after the import are estimated from the file size
and its quantization (:data:`IMPORT_FACTORS`).

Expected decode speed: one over the time of a step, its layers times the per-layer cost
plus the bytes it reads (:func:`step_bytes`: the weights but the rotary tables, and the KV
of a :data:`SPEED_CONTEXT`-token context) over the rate the engine reads fp32 or int4
weights here (each measured once, :mod:`engine.hub.bandwidth`; ``python -m
bench.fit_speed`` and ``python -m bench.catalog_table`` set it beside the measured speed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine import kernels
from engine.config import EngineConfig
from engine.hub.bandwidth import ReadSpeed, rotary_bytes
from engine.hub.remote import ModelShape
from engine.memory.governor import governor_for
from engine.memory.limits import TIER_LABELS, format_bytes, parse_limit
from engine.model.kv16_pass import I8_SCALE_BYTES, row_extra
from engine.runtime.placement import plan_placement
from engine.runtime.providers import (
    available_providers,
    int8_chosen,
    kv_room,
    provider_from_env,
    sixteen_bit,
)

FITS, SHORTER, TOO_BIG = "fits", "fits with a shorter context", "too big"
SPEED_CONTEXT = 512
#: Weights after ``import-gguf`` over the GGUF file's size, by the file's quantization
#: (its name's): measured on forged files (tests/engine/hub/test_fit.py checks them):
#: Q4_0/Q4_1/Q8_0 blocks are kept as they are; K-quants keep their codes with scales per
#: 32 (Q6_K widened to 8 bits); 2-3 bit and IQ types are re-quantized to 4 bits.
IMPORT_FACTORS = {"Q4_0": 1.10, "Q4_1": 1.10, "Q8_0": 1.05, "Q4_K": 1.23, "Q5_K": 1.45,
                  "Q5_0": 1.45, "Q5_1": 1.45, "Q6_K": 1.40, "F16": 1.03, "F32": 1.01,
                  "BF16": 2.02, "Q3_K": 1.45, "Q2_K": 1.60, "IQ": 1.45}


def import_factor(quant: str | None) -> float:
    q = (quant or "").upper()
    for key in sorted(IMPORT_FACTORS, key=len, reverse=True):
        if q.startswith(key):
            return IMPORT_FACTORS[key]
    return 1.25


#: What the expected speed is computed from: bytes/s, a ReadSpeed, or a function giving one.
Bandwidth = Callable[[], "float | ReadSpeed"] | float | ReadSpeed | None


@dataclass(frozen=True)
class Fit:
    label: str  # FITS | SHORTER | TOO_BIG
    weights_bytes: int
    kv_bytes_per_token: int
    context: int  # the default context (the model's, or the configured kv_max_len)
    kv_tokens: int | None  # tokens of KV the limit leaves (None: no limit known)
    limit_bytes: int | None
    tier: str
    provider: str
    refusal: str | None  # the governor's words when too big
    tokens_per_second: float | None
    estimated_weights: bool = False

    @property
    def text(self) -> str:
        if self.label == SHORTER:
            return f"{SHORTER} ({self.kv_tokens} tokens)"
        return self.label

    def details(self) -> str:
        """The numbers behind the label, in one paragraph."""
        est = " (estimated after import)" if self.estimated_weights else ""
        parts = [f"weights {format_bytes(self.weights_bytes)}{est}",
                 f"KV {format_bytes(self.kv_bytes_per_token)} per token, "
                 f"{format_bytes(self.kv_bytes_per_token * self.context)} for the "
                 f"{self.context}-token context",
                 f"{TIER_LABELS[self.tier]} limit {format_bytes(self.limit_bytes)}"]
        if self.kv_tokens is not None and self.label != TOO_BIG:
            parts.append(f"room for {self.kv_tokens} tokens of KV")
        if self.tokens_per_second:
            parts.append(f"decode about {self.tokens_per_second:.1f} tokens/s here (a "
                         "step's layers and the bytes it reads, at the rates measured on this "
                         "machine)")
        text = "; ".join(parts)
        return f"{text}. {self.refusal}" if self.refusal else text

    def as_dict(self) -> dict[str, object]:
        return {"label": self.label, "text": self.text, "weights_bytes": self.weights_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token, "context": self.context,
                "kv_tokens": self.kv_tokens, "limit_bytes": self.limit_bytes,
                "tier": self.tier, "provider": self.provider, "refusal": self.refusal,
                "tokens_per_second": self.tokens_per_second,
                "estimated_weights": self.estimated_weights, "details": self.details()}


def step_bytes(weights_bytes: int, shape: ModelShape, context: int) -> int:
    """The bytes a decode step reads: the weights but the rotary tables (one row of them a
    step; 34 MB of a 1B model with a 131,072-token context), and the KV of a
    :data:`SPEED_CONTEXT`-token context."""
    tables = rotary_bytes(shape.head_dim, shape.context)
    weights = weights_bytes - tables if tables < weights_bytes // 2 else weights_bytes
    return weights + shape.kv_bytes_per_token * min(context, SPEED_CONTEXT)


def engine_provider(config: EngineConfig, weights_bytes: int) -> str:
    """Where the engine would run a model of ``weights_bytes`` (its placement rule)."""
    placement = plan_placement(provider_from_env(config.provider), available_providers(),
                               weights_bytes, parse_limit(config.vram_limit,
                                                          field="vram_limit"))
    return placement.provider if placement.provider != "auto" else "cpu"


def engine_kv(shape: ModelShape, config: EngineConfig, provider: str,
              weights_bytes: int = 0) -> ModelShape:
    """``shape`` with the KV the engine keeps: 16 bits on the CPU where its kernel runs
    attention and ``config.kv_dtype`` allows (engine.model.kv16_pass; int16 rows carry a
    scale: providers.sixteen_bit), int8 where asked for or where a memory limit's room
    holds less than the context in 16 bits (the rule the load follows:
    engine.runtime.providers.int8_chosen), else as exported."""
    if shape.kv_dtype_bytes == 4 and provider == "cpu" and config.kv_dtype != "float32" \
            and config.own_kernels and kernels.status().ready and kernels.f16kv_ready():
        wide = sixteen_bit(config, [shape.head_dim])
        half = dataclasses.replace(shape, kv_dtype_bytes=2, kv_row_extra=2 * row_extra(wide))
        context = min(shape.context, config.kv_max_len or shape.context)
        if int8_chosen(config, kv_room(config, weights_bytes, context),
                       half.kv_bytes_per_token):
            return dataclasses.replace(shape, kv_dtype_bytes=1, kv_row_extra=I8_SCALE_BYTES)
        return half
    return shape


def assess(weights_bytes: int, shape: ModelShape, config: EngineConfig | None = None, *,
           bandwidth: Bandwidth = None, provider: str | None = None,
           estimated: bool = False, quantized: bool = False) -> Fit:
    """The label for a model of ``weights_bytes`` and ``shape`` under ``config``'s limits;
    ``bandwidth``: bytes/s or a :class:`ReadSpeed` (or a function measuring it) for the
    expected speed; ``quantized``: the weights are int4 (the ReadSpeed's int4 rate)."""
    config = config or EngineConfig()
    provider = provider or engine_provider(config, weights_bytes)
    context = min(shape.context, config.kv_max_len or shape.context)
    shape = engine_kv(shape, config, provider, weights_bytes)
    per_token = shape.kv_bytes_per_token
    governor = governor_for(config, provider, max(per_token * config.kv_page_size, 1),
                            weights_bytes)
    budget = governor.budget()
    assert budget is not None  # the geometry is set
    if budget.refusal:
        label = TOO_BIG
    elif budget.kv_tokens is None or budget.kv_tokens >= context:
        label = FITS
    else:
        label = SHORTER
    speed = None
    if bandwidth is not None:
        measured = bandwidth() if callable(bandwidth) else bandwidth
        read = step_bytes(weights_bytes, shape, context)
        if isinstance(measured, ReadSpeed):
            found = measured.tokens_per_second(read, shape.layers, quantized)
            speed = round(found, 2) if found else None
        else:
            speed = round(measured / read, 2) if read > 0 and measured > 0 else None
    return Fit(label, weights_bytes, per_token, context, budget.kv_tokens, budget.limit_bytes,
               governor.kv_tier, provider, budget.refusal, speed, estimated)
