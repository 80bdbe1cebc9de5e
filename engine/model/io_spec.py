"""Graph I/O roles and decode-path detection.

A model's inputs and outputs are assigned roles (token ids, mask, positions, logits, KV
pairs) from declared names (genai_config.json, inference_metadata.yaml) or, failing that,
from the naming conventions of optimum and onnxruntime-genai exports. The decode path
follows from the roles and the graph: GroupQueryAttention graphs share one KV buffer
between past and present; other past/present graphs grow by concatenation; a fixed-length
past is a static cache; no KV at all means full recomputation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine.errors import ModelLoadError, UnsupportedModelError

DecodePath = Literal["shared_buffer", "growing", "static_cache", "recompute"]
DECODE_PATHS: tuple[str, ...] = ("shared_buffer", "growing", "static_cache", "recompute")

Dim = int | str | None

# Past/present name conventions of the exporters we know, as (past regex, present template).
_KV_CONVENTIONS: tuple[tuple[str, str], ...] = (
    (r"^past_key_values\.(\d+)\.(key|value)$", "present.{layer}.{kind}"),
    (r"^past\.(\d+)\.(key|value)$", "present.{layer}.{kind}"),
    (r"^past_(key|value)_(\d+)$", "present_{kind}_{layer}"),
)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...]


@dataclass(frozen=True)
class KVPair:
    """One past input fed by one present output: `[batch, heads, seq, head_dim]`."""

    layer: int
    kind: Literal["key", "value"]
    input: str
    output: str
    num_heads: int
    head_dim: int
    dtype: str
    #: Fixed past length for a static cache, else None.
    static_len: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return self.num_heads * self.head_dim * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class DeclaredIO:
    """Names a metadata file declares; empty fields fall back to conventions."""

    input_ids: str | None = None
    attention_mask: str | None = None
    position_ids: str | None = None
    logits: str | None = None
    kv_pairs: tuple[tuple[str, str], ...] = ()
    #: printf-style patterns from genai_config.json, e.g. "past_key_values.%d.key".
    past_key_pattern: str | None = None
    past_value_pattern: str | None = None
    present_key_pattern: str | None = None
    present_value_pattern: str | None = None
    head_size: int | None = None
    kv_num_heads: int | None = None
    decode_path: str | None = None


@dataclass(frozen=True)
class IOSpec:
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    kv_pairs: tuple[KVPair, ...]
    vocab_size: int
    #: Logits for the last position only (`[B, 1, V]`, onnxruntime-genai's prune_lm_head).
    logits_last_only: bool
    logits_dtype: str
    decode_path: DecodePath
    static_max_len: int | None
    #: Why the roles were guessed from names, when they were.
    convention_warnings: tuple[str, ...] = ()
    #: The int64 `[1]` input that asks for the last N positions' logits only, where the
    #: engine added one at load (engine.model.graph_passes); None = every position's.
    logits_to_keep: str | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(p.bytes_per_token for p in self.kv_pairs)

    @property
    def num_layers(self) -> int:
        return len({p.layer for p in self.kv_pairs})

    def as_dict(self) -> dict[str, object]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "logits": self.logits,
            "logits_last_only": self.logits_last_only,
            "logits_to_keep": self.logits_to_keep,
            "vocab_size": self.vocab_size,
            "decode_path": self.decode_path,
            "static_max_len": self.static_max_len,
            "kv_layers": self.num_layers,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_pairs": [
                {"layer": p.layer, "kind": p.kind, "input": p.input, "output": p.output,
                 "num_heads": p.num_heads, "head_dim": p.head_dim, "dtype": p.dtype}
                for p in self.kv_pairs
            ],
        }


def resolve_io(
    inputs: Mapping[str, TensorSpec],
    outputs: Mapping[str, TensorSpec],
    declared: DeclaredIO,
    *,
    has_gqa: bool,
    source: str,
) -> IOSpec:
    """Assign roles to every input and output; unknown inputs are a load error."""
    warnings: list[str] = []

    def pick(role: str, declared_name: str | None, candidates: Sequence[str],
             pool: Mapping[str, TensorSpec], required: bool) -> str | None:
        if declared_name:
            if declared_name not in pool:
                raise ModelLoadError(
                    f"{source} names '{declared_name}' as the {role}, but the graph has no "
                    f"such tensor (it has: {', '.join(sorted(pool))})",
                    hint=f"correct the {role} name in {source}",
                )
            return declared_name
        for name in candidates:
            if name in pool:
                return name
        if required:
            raise ModelLoadError(
                f"cannot find the {role} among the graph's tensors "
                f"({', '.join(sorted(pool))})",
                hint="add an inference_metadata.yaml naming it under io:",
            )
        return None

    input_ids = pick("token input", declared.input_ids, ("input_ids", "tokens", "input"),
                     inputs, True)
    mask = pick("attention mask", declared.attention_mask, ("attention_mask",), inputs, False)
    positions = pick("position ids", declared.position_ids, ("position_ids",), inputs, False)
    logits = pick("logits output", declared.logits, ("logits",), outputs, True)
    assert input_ids is not None and logits is not None

    pairs = _kv_pairs(inputs, outputs, declared, warnings)
    assigned = {input_ids, mask, positions} | {p.input for p in pairs}
    unknown = sorted(set(inputs) - assigned)
    if unknown:
        raise ModelLoadError(
            f"the graph has inputs with no known role: {', '.join(unknown)}",
            hint="declare them in inference_metadata.yaml, or export the model with "
                 "onnxruntime-genai's builder or optimum",
        )
    logits_spec = outputs[logits]
    vocab = logits_spec.shape[-1] if logits_spec.shape else None
    if not isinstance(vocab, int):
        raise ModelLoadError(
            f"the logits output '{logits}' has no static vocabulary dimension "
            f"(shape {list(logits_spec.shape)})",
            hint="re-export the model with a fixed vocab size",
        )
    last_only = len(logits_spec.shape) == 3 and logits_spec.shape[1] == 1
    path, static_len = _decode_path(pairs, has_gqa, declared.decode_path, mask, source)
    return IOSpec(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, logits=logits,
        kv_pairs=pairs, vocab_size=vocab, logits_last_only=last_only,
        logits_dtype=logits_spec.dtype, decode_path=path, static_max_len=static_len,
        convention_warnings=tuple(warnings),
    )


def _decode_path(
    pairs: Sequence[KVPair], has_gqa: bool, declared: str | None, mask: str | None, source: str
) -> tuple[DecodePath, int | None]:
    static = {p.static_len for p in pairs}
    static_len = next(iter(static)) if len(static) == 1 else None
    if declared is not None:
        if declared not in DECODE_PATHS:
            raise ModelLoadError(
                f"{source} declares decode_path '{declared}'",
                hint=f"use one of {', '.join(DECODE_PATHS)} or leave it out to detect it",
            )
        path: DecodePath = declared  # type: ignore[assignment]
    elif not pairs:
        path = "recompute"
    elif static_len is not None:
        path = "static_cache"
    else:
        path = "shared_buffer" if has_gqa else "growing"
    if path == "static_cache" and (static_len is None or mask is None):
        raise UnsupportedModelError(
            "a static-cache graph needs fixed-length past KV inputs and an attention mask",
            hint="check the past_key_values shapes or declare decode_path: growing",
        )
    if path == "shared_buffer" and not has_gqa:
        raise UnsupportedModelError(
            f"{source} asks for a shared KV buffer but the graph has no GroupQueryAttention",
            hint="use decode_path: growing for graphs that concatenate past and new KV",
        )
    return path, static_len if path == "static_cache" else None


def _kv_pairs(
    inputs: Mapping[str, TensorSpec],
    outputs: Mapping[str, TensorSpec],
    declared: DeclaredIO,
    warnings: list[str],
) -> tuple[KVPair, ...]:
    named: list[tuple[int, str, str, str]] = []  # layer, kind, input, output
    if declared.kv_pairs:
        for index, (past, present) in enumerate(declared.kv_pairs):
            layer, kind = _layer_kind(past, index)
            named.append((layer, kind, past, present))
    elif declared.past_key_pattern and declared.present_key_pattern:
        layer = 0
        while declared.past_key_pattern % layer in inputs:
            for kind, past_pat, present_pat in (
                ("key", declared.past_key_pattern, declared.present_key_pattern),
                ("value", declared.past_value_pattern, declared.present_value_pattern),
            ):
                if past_pat and present_pat:
                    named.append((layer, kind, past_pat % layer, present_pat % layer))
            layer += 1
    else:
        for name in inputs:
            for regex, template in _KV_CONVENTIONS:
                match = re.match(regex, name)
                if match:
                    a, b = match.groups()
                    layer_s, kind = (a, b) if a.isdigit() else (b, a)
                    present = template.format(layer=layer_s, kind=kind)
                    named.append((int(layer_s), kind, name, present))
        named.sort(key=lambda item: (item[0], item[1]))
    pairs = []
    for layer, kind, past, present in named:
        pairs.append(_kv_pair(layer, kind, past, present, inputs, outputs, declared))
    return tuple(pairs)


def _layer_kind(name: str, index: int) -> tuple[int, str]:
    digits = re.findall(r"\d+", name)
    layer = int(digits[-1]) if digits else index // 2
    words = [w for w in re.split(r"[^a-z]+", name.lower()) if w]
    last = words[-1] if words else ""
    if last in ("key", "keys", "k", "value", "values", "v"):  # past_key_values.0.key
        kind = "key" if last.startswith("k") else "value"
    else:
        kind = "value" if ("value" in name or name.endswith(".v") or "_v" in name) else "key"
    return layer, kind


def _kv_pair(
    layer: int, kind: str, past: str, present: str,
    inputs: Mapping[str, TensorSpec], outputs: Mapping[str, TensorSpec], declared: DeclaredIO,
) -> KVPair:
    if past not in inputs:
        raise ModelLoadError(f"KV input '{past}' is not an input of the graph",
                             hint="fix the KV names in the model's metadata")
    if present not in outputs:
        raise ModelLoadError(
            f"KV input '{past}' has no matching output '{present}'",
            hint="declare the past/present pairs in inference_metadata.yaml (kv_pairs:)",
        )
    spec = inputs[past]
    if len(spec.shape) != 4:
        raise UnsupportedModelError(
            f"KV input '{past}' has rank {len(spec.shape)}; expected [batch, heads, seq, head_dim]",
            hint="only BNSH-layout KV caches are supported",
        )
    heads = spec.shape[1] if isinstance(spec.shape[1], int) else declared.kv_num_heads
    head_dim = spec.shape[3] if isinstance(spec.shape[3], int) else declared.head_size
    if heads is None or head_dim is None:
        which = "head count" if heads is None else "head dim"
        raise ModelLoadError(
            f"cannot infer the KV {which} of '{past}': its dimension is symbolic "
            f"({spec.shape[1] if heads is None else spec.shape[3]!r})",
            hint="give head_size / num_key_value_heads in genai_config.json or "
                 "inference_metadata.yaml",
        )
    static_len = spec.shape[2] if isinstance(spec.shape[2], int) and spec.shape[2] > 0 else None
    if spec.dtype not in ("float32", "float16"):
        raise UnsupportedModelError(
            f"KV input '{past}' has dtype {spec.dtype}",
            hint="only float32 and float16 KV caches are supported",
        )
    return KVPair(layer, kind, past, present, int(heads), int(head_dim),  # type: ignore[arg-type]
                  spec.dtype, static_len)
