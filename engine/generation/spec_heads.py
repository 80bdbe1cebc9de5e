"""Model-declared speculative proposers: MTP heads, EAGLE-3 heads, shared-KV assistants.

A model folder declares its proposer in the `speculative:` block of its
``inference_metadata.yaml``, or the caller passes the same mapping as
``EngineConfig.speculative_head`` (format: docs/speculative.md, "Declared speculative heads").
Every contract the seed checks is checked at load from the graphs' declared I/O (nothing
is run, no weights are read): the target exposes the hidden-state outputs with an allowed
dtype and a shape ending in the hidden size, the head's hidden / fused hidden / vocabulary
sizes agree with the target, weight files hold whole float32 values of the right count,
and an MTP `accepted_prefix` cache scope is refused as not executable. A violation is a
ModelLoadError saying what was expected, what arrived and how to fix it. MTP heads without
their own KV run (``engine.generation.mtp``); the other kinds pass validation but do not run yet.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.generation.spec_head_config import HeadConfig, parse_head_config
from engine.model.graph_summary import scan_graph
from engine.model.io_spec import IOSpec, TensorSpec
from engine.model.model_dir import ModelDir

log = logging.getLogger(__name__)

_FLOATS = ("float32", "float16", "bfloat16")
_EAGLE3_LAYERS = 3


@dataclass(frozen=True)
class HeadSignature:
    """What the head graph's I/O says about it."""

    hidden_size: int
    draft_vocab_size: int | None
    fused_hidden_size: int | None = None
    head_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeclaredHead:
    """A proposer that passed every load-time contract check. MTP heads without their own
    KV run (speculative_mode="mtp", engine.mtp); the others are not executed yet."""

    config: HeadConfig
    signature: HeadSignature
    target_vocab_size: int
    source: str
    #: Why it cannot run here; None when it runs.
    not_executable: str | None = None

    @property
    def executable(self) -> bool:
        return self.not_executable is None

    def describe(self) -> dict[str, object]:
        return {"type": self.config.kind, "model": str(self.config.model),
                "hidden_size": self.signature.hidden_size,
                "draft_vocab_size": self.signature.draft_vocab_size,
                "executable": self.executable, "not_executable": self.not_executable}


def load_declared_head(model: ModelDir, spec: IOSpec,
                       override: Mapping[str, Any] | None = None) -> DeclaredHead | None:
    """The model's declared proposer, validated against its graph; None when none is."""
    meta = model.config if model.format == "metadata" else {}
    block = override if override is not None else meta.get("speculative")
    if not block:
        return None
    source = ("EngineConfig.speculative_head" if override is not None
              else f"{model.path / 'inference_metadata.yaml'}: speculative")
    io = meta.get("io") if isinstance(meta.get("io"), Mapping) else {}
    config = parse_head_config(block, model.path, source,
                               default_hidden_output=(io or {}).get("hidden_output"))
    signature = validate_head(config, model.graph.outputs, spec, source)
    why = _not_executable(config, signature, model.graph.outputs)
    if why is None:
        log.info("%s: the %s head passed its contract checks; speculative_mode='mtp' runs it",
                 source, config.label)
    else:
        log.warning("%s declares a %s; it passed its contract checks, but %s: requests "
                    "speculate with prompt_lookup or draft_model only", source, config.label,
                    why)
    return DeclaredHead(config, signature, spec.vocab_size, source, why)


def _not_executable(config: HeadConfig, sig: HeadSignature,
                    target_outputs: Mapping[str, TensorSpec]) -> str | None:
    """Why this runtime cannot run a valid head (None when it can)."""
    io = config.head_io
    if config.kind != "mtp":
        return f"executing {config.label} heads is not implemented yet"
    if config.hidden_layout != "bsh" or \
            target_outputs[config.target_hidden_outputs[0]].dtype != "float32":
        return "executing MTP heads on bshc or non-float32 hidden states is not implemented yet"
    if sig.draft_vocab_size is None:
        return "executing MTP heads that output hidden states (lm_head_weights) is not " \
               "implemented yet"
    extra = sorted(set(sig.head_inputs) - {io.hidden_input, io.embeds_input})
    if extra:
        return (f"executing MTP heads with inputs beyond the hidden state and embeddings "
                f"({', '.join(extra)}: their own KV?) is not implemented yet")
    return None


# --- validation -------------------------------------------------------------------------


def validate_head(config: HeadConfig, target_outputs: Mapping[str, TensorSpec], spec: IOSpec,
                  source: str) -> HeadSignature:
    """Check the declared proposer against the target graph and its own graph."""
    label = config.label
    if config.kind == "mtp" and config.cache_scope == "accepted_prefix":
        raise UnsupportedModelError(
            "MTP cache_scope accepted_prefix is declared but not executable: the frozen "
            "Mobius contract does not define correction-token/cache alignment",
            hint=f"declare cache_scope: full in {source}, or remove the speculative block")
    vocab = config.vocab_size or spec.vocab_size
    if vocab > spec.vocab_size:
        raise ModelLoadError(
            f"{source}.vocab_size {vocab} exceeds the target's vocabulary {spec.vocab_size}",
            hint=f"set vocab_size to at most {spec.vocab_size} or leave it out")
    names = config.target_hidden_outputs
    if config.kind == "shared_kv" and not names:
        names = _detect_hidden_output(target_outputs, config.hidden_size, spec.logits)
    if not names:
        raise ModelLoadError(f"{label} needs the name of the target's hidden-state output",
                             hint=f"set target_hidden_output in {source} or io.hidden_output")
    if config.kind == "eagle3" and len(names) != _EAGLE3_LAYERS:
        raise ModelLoadError(
            f"EAGLE-3 fuses {_EAGLE3_LAYERS} target layers; {source} names {len(names)} "
            f"hidden-state outputs ({', '.join(names)})",
            hint="list exactly three outputs (low, middle, high layer) in "
                 "target_hidden_outputs")
    for name in names:
        _check_target_hidden(config, target_outputs, name)
    head = scan_graph(config.model) if config.model.is_file() else None
    if head is None:
        raise ModelLoadError(f"the {label} model {config.model} does not exist",
                             hint=f"put the head graph there or fix model: in {source}")
    signature = _head_signature(config, head.inputs, head.outputs)
    _check_signature(config, signature, vocab, len(names))
    if config.kind == "shared_kv":
        _check_groups(config, head.inputs, spec)
    _check_weights(config, vocab, signature)
    return signature


def _detect_hidden_output(outputs: Mapping[str, TensorSpec], hidden: int,
                          logits: str) -> tuple[str, ...]:
    """The seed's auto-detection: the first float32 non-logits output ending in `hidden`."""
    for name, out in outputs.items():
        if name != logits and "logits" not in name.lower() and out.dtype == "float32" \
                and out.shape and out.shape[-1] == hidden:
            return (name,)
    return ()


def _check_target_hidden(config: HeadConfig, outputs: Mapping[str, TensorSpec],
                         name: str) -> None:
    label, hidden = config.label, config.hidden_size
    out = outputs.get(name)
    if out is None:
        raise ModelLoadError(
            f"{label} target model must expose hidden-state output '{name}'; its outputs "
            f"are: {', '.join(outputs)}",
            hint="export the target with its hidden states as graph outputs, or name the "
                 "right output in the speculative block")
    allowed = _FLOATS if config.kind == "mtp" else ("float32",)
    if out.dtype not in allowed:
        raise ModelLoadError(
            f"{label} target hidden-state output '{name}' must be {' or '.join(allowed)}, "
            f"got {out.dtype}", hint=f"re-export '{name}' as float32")
    shape = list(out.shape)
    if config.kind == "mtp" and config.hidden_layout == "bshc":
        ok = len(shape) == 4 and shape[2] == config.hc_mult and shape[3] == hidden
        expected = f"[batch, seq, {config.hc_mult}, {hidden}] (bshc, hc_mult {config.hc_mult})"
    else:
        ok = (len(shape) == 3 or config.kind != "mtp") and bool(shape) and shape[-1] == hidden
        expected = f"[batch, seq, {hidden}]"
    if not ok:
        raise ModelLoadError(
            f"{label} target hidden-state output '{name}' shape {shape} does not end in "
            f"configured hidden size {hidden} (expected {expected})",
            hint=f"set hidden_size to the target's hidden size ({shape[-1] if shape else '?'})"
                 " or name the right output")


def _last_dim(tensors: Mapping[str, TensorSpec], name: str) -> int | None:
    tensor = tensors.get(name)
    dim = tensor.shape[-1] if tensor is not None and tensor.shape else None
    return dim if isinstance(dim, int) and dim > 0 else None


def _head_signature(config: HeadConfig, inputs: Mapping[str, TensorSpec],
                    outputs: Mapping[str, TensorSpec]) -> HeadSignature:
    io, label = config.head_io, config.label
    logits = _last_dim(outputs, io.logits_output)
    if config.kind == "mtp":
        hidden = _last_dim(inputs, io.hidden_input)
        produces = logits is not None or _last_dim(outputs, io.hidden_output) is not None
        wanted = (f"input '{io.hidden_input}' [batch, seq, hidden] and output "
                  f"'{io.logits_output}' (or '{io.hidden_output}' with lm_head_weights)")
    elif config.kind == "eagle3":
        hidden = _last_dim(inputs, io.embeds_input)
        fused = _last_dim(inputs, io.hidden_input)
        produces = logits is not None and fused is not None
        wanted = (f"inputs '{io.hidden_input}' (fused) and '{io.embeds_input}', output "
                  f"'{io.logits_output}'")
    else:
        hidden = _last_dim(inputs, io.embeds_input)
        produces = logits is not None
        wanted = f"input '{io.embeds_input}' and output '{io.logits_output}'"
    if hidden is None or not produces:
        raise ModelLoadError(
            f"configured {label} model {config.model.name} does not expose {label} I/O: "
            f"expected {wanted} with static last dimensions; it has inputs "
            f"{', '.join(inputs) or '-'} and outputs {', '.join(outputs) or '-'}",
            hint="name the head's tensors in head_io, or re-export the head")
    return HeadSignature(hidden, logits, fused if config.kind == "eagle3" else None,
                         tuple(inputs))


def _check_signature(config: HeadConfig, sig: HeadSignature, vocab: int, layers: int) -> None:
    label, hidden = config.label, config.hidden_size
    if sig.hidden_size != hidden:
        which = "backbone " if config.kind == "shared_kv" else "target "
        raise ModelLoadError(
            f"{label} head hidden size {sig.hidden_size} does not match configured "
            f"{which}hidden size {hidden}",
            hint="use the head trained for this target, or fix hidden_size")
    if sig.fused_hidden_size is not None and sig.fused_hidden_size != hidden * layers:
        raise ModelLoadError(
            f"EAGLE-3 head fused hidden size {sig.fused_hidden_size} does not match "
            f"{layers} target layers totaling {hidden * layers} ({layers} x {hidden})",
            hint="the head must be trained on exactly these target layers")
    if sig.draft_vocab_size is None:
        return
    if config.kind == "shared_kv" and sig.draft_vocab_size != vocab:
        raise ModelLoadError(
            f"shared-KV proposer vocabulary {sig.draft_vocab_size} does not match configured "
            f"vocab size {vocab}", hint="use the assistant exported for this target")
    if sig.draft_vocab_size > vocab:
        raise ModelLoadError(
            f"{label} draft vocabulary {sig.draft_vocab_size} exceeds target embedding "
            f"vocabulary {vocab}", hint="use the head exported for this target's tokenizer")


def _check_groups(config: HeadConfig, inputs: Mapping[str, TensorSpec], spec: IOSpec) -> None:
    target_kv = {p.input for p in spec.kv_pairs}
    for group in config.shared_kv:
        for field in ("key_input", "value_input", "target_key_input", "target_value_input"):
            if not getattr(group, field):
                raise ModelLoadError(
                    f"shared_kv group '{group.name}' is missing {field}",
                    hint="declare exact proposer and target KV port names so the runtime "
                         "never infers cache roles from model or tensor names")
        if group.key_input not in inputs or group.value_input not in inputs:
            raise ModelLoadError(
                f"shared-KV proposer model does not expose shared_kv group '{group.name}' "
                f"(inputs '{group.key_input}', '{group.value_input}'); it has "
                f"{', '.join(inputs)}", hint="fix key_input / value_input")
        for name in (group.target_key_input, group.target_value_input):
            if name not in target_kv:
                raise ModelLoadError(
                    f"shared_kv group '{group.name}' reads target KV input '{name}', which is "
                    f"not a KV input of the target ({', '.join(sorted(target_kv)) or 'none'})",
                    hint="name the target decoder's exact past KV input")


def _check_weights(config: HeadConfig, vocab: int, sig: HeadSignature) -> None:
    hidden, io = config.hidden_size, config.head_io
    needs_embed = config.kind != "mtp" or io.embeds_input in sig.head_inputs
    needs_lm_head = config.kind == "mtp" and sig.draft_vocab_size is None
    files = [("embedding_weights", config.embedding_weights, vocab, hidden, needs_embed),
             ("lm_head_weights", config.lm_head_weights, hidden, vocab, needs_lm_head)]
    for field, path, rows, cols, required in files:
        if path is None:
            if required:
                reason = (f"its head outputs '{io.hidden_output}', not logits"
                          if field == "lm_head_weights" else "it embeds the proposed tokens")
                raise ModelLoadError(f"{config.label} needs {field} ({reason})",
                                     hint=f"add {field}: <raw float32 file [{rows}, {cols}]>")
            continue
        check_f32_file(path, rows, cols, f"{config.label} {field}")


def check_f32_file(path: Path, rows: int, cols: int, what: str) -> None:
    """A raw little-endian float32 matrix file: present, whole values, rows x cols of them."""
    if not path.is_file():
        raise ModelLoadError(f"{what} file '{path}' does not exist",
                             hint="put the file there or fix the path in the metadata")
    size = path.stat().st_size
    if size % 4:
        raise ModelLoadError(
            f"f32 weight file '{path}' has byte length {size}, which is not divisible by 4",
            hint="write the weights as raw little-endian float32 (numpy: a.astype('<f4')."
                 "tofile(path))")
    if size // 4 != rows * cols:
        raise ModelLoadError(
            f"{what} file '{path}' holds {size // 4} float32 values; expected "
            f"{rows} x {cols} = {rows * cols}",
            hint="export the matrix for this model's vocabulary and hidden size")
