"""The declared form of a model's speculative proposer (MTP / EAGLE-3 / shared-KV head).

Parsed from the `speculative:` block of ``inference_metadata.yaml`` or from
``EngineConfig.speculative_head`` (format: docs/speculative.md, "Declared speculative heads"); a
malformed block is a ModelLoadError naming the key. ``engine.generation.spec_heads`` checks it
against the graphs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.errors import ModelLoadError

HeadKind = Literal["mtp", "eagle3", "shared_kv"]
_LABEL = {"mtp": "MTP", "eagle3": "EAGLE-3", "shared_kv": "shared-KV proposer"}


@dataclass(frozen=True)
class HeadIO:
    """Tensor names of the head graph (defaults follow the common exports)."""

    hidden_input: str = "hidden_states"
    embeds_input: str = "inputs_embeds"
    logits_output: str = "logits"
    hidden_output: str = "hidden_states_out"


@dataclass(frozen=True)
class SharedKvGroup:
    """Proposer KV inputs that read the target's cache instead of their own."""

    name: str
    target_layers: tuple[int, ...]
    key_input: str | None
    value_input: str | None
    target_key_input: str | None
    target_value_input: str | None


@dataclass(frozen=True)
class HeadConfig:
    """A declared proposer, paths resolved; which fields matter depends on `kind`."""

    kind: HeadKind
    model: Path
    hidden_size: int
    #: None = the target's logits vocabulary.
    vocab_size: int | None = None
    target_hidden_outputs: tuple[str, ...] = ()
    embedding_weights: Path | None = None
    lm_head_weights: Path | None = None
    num_speculative_tokens: int = 1
    cache_scope: Literal["full", "accepted_prefix"] = "full"
    hidden_layout: Literal["bsh", "bshc"] = "bsh"
    hc_mult: int = 1
    head_io: HeadIO = HeadIO()
    shared_kv: tuple[SharedKvGroup, ...] = ()

    @property
    def label(self) -> str:
        return _LABEL[self.kind]


# --- parsing ----------------------------------------------------------------------------


def _int(block: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = block.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{source}.{key} must be an integer > 0, got {value!r}",
                             hint=f"declare {key}: <positive integer>")
    return value


def _path(block: Mapping[str, Any], key: str, root: Path, source: str) -> Path | None:
    value = block.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ModelLoadError(f"{source}.{key} must be a file name, got {value!r}",
                             hint="give a path relative to the model folder")
    return root / value


def _choice(block: Mapping[str, Any], key: str, allowed: Sequence[str], source: str,
            required: bool = False) -> Any:
    value = block.get(key, None if required else allowed[0])
    if value not in allowed:
        raise ModelLoadError(f"{source}.{key} must be one of {', '.join(allowed)}, "
                             f"got {value!r}", hint=f"use {key}: {allowed[0]}")
    return value


def parse_head_config(block: object, root: Path, source: str,
                      default_hidden_output: str | None = None) -> HeadConfig:
    """A `speculative:` mapping as a HeadConfig; a malformed one is a ModelLoadError."""
    if not isinstance(block, Mapping):
        raise ModelLoadError(f"{source} must be a mapping, got {type(block).__name__}",
                             hint="see docs/speculative.md, 'Declared speculative heads'")
    kind = _choice(block, "type", ("mtp", "eagle3", "shared_kv"), source, required=True)
    model = _path(block, "model", root, source)
    if model is None:
        raise ModelLoadError(f"{source} declares a {_LABEL[kind]} but no model:",
                             hint="add model: <head graph>.onnx (relative to the folder)")
    outputs = block.get("target_hidden_outputs") if kind == "eagle3" else \
        [block.get("target_hidden_output", default_hidden_output)]
    if not isinstance(outputs, list) or not all(isinstance(o, str) or o is None
                                                for o in outputs):
        raise ModelLoadError(f"{source}.target_hidden_outputs must be a list of output "
                             f"names, got {outputs!r}", hint="e.g. [h.3, h.14, h.27]")
    head_io = block.get("head_io") or {}
    if not isinstance(head_io, Mapping) or set(head_io) - set(HeadIO.__dataclass_fields__) \
            or not all(isinstance(v, str) and v for v in head_io.values()):
        raise ModelLoadError(f"{source}.head_io must map {', '.join(HeadIO.__dataclass_fields__)}"
                             f" to tensor names, got {head_io!r}", hint="fix head_io")
    vocab = block.get("vocab_size")
    return HeadConfig(
        kind=kind, model=model, hidden_size=_int(block, "hidden_size", source),
        vocab_size=None if vocab is None else _int(block, "vocab_size", source),
        target_hidden_outputs=tuple(o for o in outputs if o),
        embedding_weights=_path(block, "embedding_weights", root, source),
        lm_head_weights=_path(block, "lm_head_weights", root, source),
        num_speculative_tokens=_int(block, "num_speculative_tokens", source, 1),
        cache_scope=_choice(block, "cache_scope", ("full", "accepted_prefix"), source),
        hidden_layout=_choice(block, "hidden_layout", ("bsh", "bshc"), source),
        hc_mult=_int(block, "hc_mult", source, 1), head_io=HeadIO(**head_io),
        shared_kv=_groups(block.get("shared_kv"), source) if kind == "shared_kv" else ())


def _groups(items: object, source: str) -> tuple[SharedKvGroup, ...]:
    if not isinstance(items, list) or not items:
        raise ModelLoadError(f"{source}.shared_kv must list the shared KV groups, got "
                             f"{items!r}", hint="declare at least one group with name: and "
                             "its key_input / value_input / target_key_input / "
                             "target_value_input")
    groups = []
    for item in items:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ModelLoadError(f"{source}.shared_kv entries need a name:, got {item!r}",
                                 hint="e.g. - {name: g0, key_input: k0, ...}")
        layers = item.get("target_layers") or []
        if not isinstance(layers, list) or not all(isinstance(x, int) for x in layers):
            raise ModelLoadError(f"{source}.shared_kv '{item['name']}': target_layers must "
                                 f"list layer numbers, got {layers!r}", hint="e.g. [0, 1]")
        groups.append(SharedKvGroup(
            item["name"], tuple(int(x) for x in layers), item.get("key_input"),
            item.get("value_input"), item.get("target_key_input"),
            item.get("target_value_input")))
    return tuple(groups)
