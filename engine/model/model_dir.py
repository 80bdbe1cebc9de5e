"""Find and validate a model folder without loading its weights.

Three metadata sources are understood — onnxruntime-genai's `genai_config.json`, our own
`inference_metadata.yaml`, a Hugging Face `config.json` (optimum exports) — and a folder
with none of them falls back to naming conventions with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.model.graph_summary import AttentionShape as AttentionShape
from engine.model.graph_summary import ExternalData as ExternalData
from engine.model.graph_summary import GraphSummary as GraphSummary
from engine.model.graph_summary import scan_graph as scan_graph
from engine.model.io_spec import DeclaredIO

log = logging.getLogger(__name__)

ModelFormat = Literal["genai", "metadata", "optimum", "convention"]
METADATA_FILE = "inference_metadata.yaml"

#: Metadata keys we accept but do not act on yet would silently change results:
#: refuse them by name instead.
_UNSUPPORTED_METADATA = ("recurrent_state_pairs",)
#: `speculative` (a declared MTP / EAGLE-3 / shared-KV proposer) is validated at engine
#: load by engine.spec_heads; `sliding_window` / `attention_sinks` by engine.kv.window.
_KNOWN_METADATA = {"inference_metadata_version", "model_file", "decode_path",
                   "max_sequence_length", "io", "kv_pairs", "eos_token_ids", "bos_token_id",
                   "head_size", "kv_num_heads", "memory_limits", "speculative",
                   "sliding_window", "attention_sinks", "sink_tokens",
                   *_UNSUPPORTED_METADATA}


@dataclass(frozen=True)
class ModelDir:
    path: Path
    format: ModelFormat
    model_file: Path
    declared: DeclaredIO
    graph: GraphSummary
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    warnings: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def weights_bytes(self) -> int:
        return self.graph.inline_weights_bytes + sum(e.size for e in self.graph.external_data)

    @property
    def name(self) -> str:
        return self.path.name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}",
                             hint="re-download or re-export the model folder") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} holds {type(data).__name__}, expected a JSON object",
                             hint="re-download or re-export the model folder")
    return data


def _ids(value: object) -> tuple[int, ...]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def load_model_dir(path: str | Path) -> ModelDir:
    """Read a model folder's metadata and graph structure; raise ModelLoadError if unusable."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ModelLoadError(f"model folder {root} does not exist or is not a folder",
                             hint="pass the folder that holds model.onnx and tokenizer.json")
    fmt: ModelFormat
    if (root / "genai_config.json").is_file():
        fmt, (declared, info) = "genai", _from_genai(root)
    elif (root / METADATA_FILE).is_file():
        fmt, (declared, info) = "metadata", _from_metadata(root)
    elif (root / "config.json").is_file():
        fmt, (declared, info) = "optimum", _from_hf(root)
    else:
        fmt, declared, info = "convention", DeclaredIO(), {"model_file": _find_onnx(root)}
    warnings: list[str] = list(info.get("warnings", []))
    if fmt == "convention":
        warnings.append(
            f"{root} has no genai_config.json, {METADATA_FILE} or config.json; "
            "input/output roles are guessed from their names")
    model_file = root / str(info["model_file"])
    if not (root / "tokenizer.json").is_file():
        raise ModelLoadError(f"{root} has no tokenizer.json",
                             hint="copy the model's tokenizer.json into the folder "
                                  "(it ships with the original Hugging Face model)")
    graph = scan_graph(model_file)
    context = info.get("context_length")
    if context is None:
        context = 2048
        warnings.append("the model declares no context length; assuming 2048 tokens")
    _check_against_graph(root, fmt, declared, info, graph)
    for w in warnings:
        log.warning("%s", w)
    return ModelDir(
        path=root, format=fmt, model_file=model_file, declared=declared, graph=graph,
        context_length=context, eos_token_ids=tuple(info.get("eos", ())),
        bos_token_id=info.get("bos"), warnings=tuple(warnings),
        config=info.get("config", {}),
    )


#: Where each metadata format keeps what _check_against_graph compares: (file, context
#: length key, head size key, KV heads key).
_KEYS = {
    "genai": ("genai_config.json", "model.context_length", "model.decoder.head_size",
              "model.decoder.num_key_value_heads"),
    "metadata": (METADATA_FILE, "max_sequence_length", "head_size", "kv_num_heads"),
    "optimum": ("config.json", "max_position_embeddings", None, None),
}


def _check_against_graph(root: Path, fmt: ModelFormat, declared: DeclaredIO,
                         info: Mapping[str, Any], graph: GraphSummary) -> None:
    """Refuse metadata that contradicts the graph, naming both values: the engine sizes the
    KV cache and the context from the metadata, and a wrong number would otherwise surface
    as an ONNX Runtime error at the first token, or past the rotary table."""
    if fmt == "convention":
        return
    file, context_key, head_key, kv_heads_key = _KEYS[fmt]
    where = root / file

    def refuse(message: str, hint: str) -> None:
        raise ModelLoadError(f"{where}: {message}", hint=hint)

    context = info.get("context_length")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int)
                                or context <= 0):
        refuse(f"{context_key} is {context!r}; expected a positive number of tokens",
               "set it to the model's context length (max_position_embeddings in the "
               "original model's config.json), or remove it to assume 2048")
    attention = graph.attention
    if attention is not None and attention.rotary_positions is not None \
            and isinstance(context, int) and context > attention.rotary_positions:
        refuse(f"{context_key} is {context}, but the graph's rotary table (cos_cache) "
               f"covers {attention.rotary_positions} positions",
               f"set {context_key} to {attention.rotary_positions} or less, or re-export the "
               "model for the longer context")
    kv_keys = sorted(n for n in graph.inputs if _is_past_key(n, declared))
    if fmt == "genai":
        layers = info.get("config", {}).get("model", {}).get("decoder", {}) \
            .get("num_hidden_layers")
        found = len(kv_keys) if kv_keys else (attention.layers if attention else None)
        if isinstance(layers, int) and found is not None and layers != found:
            refuse(f"model.decoder.num_hidden_layers is {layers}, but the graph has "
                   f"{found} layers (KV inputs {declared.past_key_pattern!r} for layers 0 to "
                   f"{found - 1})", f"set num_hidden_layers to {found}, or use the "
                   "genai_config.json exported with this model.onnx")
    first_key = declared.kv_pairs[0][0] if declared.kv_pairs else (
        kv_keys[0] if kv_keys else None)
    first = graph.inputs.get(first_key) if first_key else None
    shape = first.shape if first is not None and len(first.shape) == 4 else (None,) * 4
    graph_heads = shape[1] if isinstance(shape[1], int) else (
        attention.kv_num_heads if attention else None)
    graph_head_size = shape[3] if isinstance(shape[3], int) else (
        attention.head_size if attention else None)
    for key, said, actual, unit in (
            (head_key, declared.head_size, graph_head_size, "a head size of"),
            (kv_heads_key, declared.kv_num_heads, graph_heads, "a KV head count of")):
        if key is None or said is None or actual is None or said == actual:
            continue
        refuse(f"{key} is {said!r}, but the graph's attention has {unit} {actual}",
               f"set {key.rsplit('.', 1)[-1]} to {actual}, or use the {file} exported with "
               "this model")


def _is_past_key(name: str, declared: DeclaredIO) -> bool:
    """Whether ``name`` is a layer's past-key input under the declared pattern."""
    pattern = declared.past_key_pattern
    if not pattern or "%d" not in pattern:
        return False
    head, _, tail = pattern.partition("%d")
    middle = name[len(head):len(name) - len(tail)] if tail else name[len(head):]
    return name.startswith(head) and name.endswith(tail) and middle.isdigit()


def _find_onnx(root: Path) -> str:
    if (root / "model.onnx").is_file():
        return "model.onnx"
    candidates = sorted(p.name for p in root.glob("*.onnx"))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ModelLoadError(f"{root} holds no .onnx file",
                             hint="point at the folder that holds the exported model.onnx")
    raise ModelLoadError(
        f"{root} holds several .onnx files ({', '.join(candidates)}) and no metadata "
        "saying which is the decoder",
        hint=f"add an {METADATA_FILE} with model_file: <name>")


def _from_genai(root: Path) -> tuple[DeclaredIO, dict[str, Any]]:
    cfg = _read_json(root / "genai_config.json")
    model = cfg.get("model", {})
    decoder = model.get("decoder", {}) if isinstance(model, dict) else {}
    if not isinstance(decoder, dict) or "filename" not in decoder:
        raise ModelLoadError(f"{root / 'genai_config.json'} has no model.decoder.filename",
                             hint="re-export the model with onnxruntime-genai's builder")
    ins = decoder.get("inputs", {})
    outs = decoder.get("outputs", {})
    declared = DeclaredIO(
        input_ids=ins.get("input_ids"), attention_mask=ins.get("attention_mask"),
        position_ids=ins.get("position_ids"), logits=outs.get("logits"),
        past_key_pattern=ins.get("past_key_names"),
        past_value_pattern=ins.get("past_value_names"),
        present_key_pattern=outs.get("present_key_names"),
        present_value_pattern=outs.get("present_value_names"),
        head_size=decoder.get("head_size"), kv_num_heads=decoder.get("num_key_value_heads"),
    )
    gen_cfg = root / "generation_config.json"
    eos = _ids(model.get("eos_token_id"))
    if gen_cfg.is_file():
        eos = eos + tuple(t for t in _ids(_read_json(gen_cfg).get("eos_token_id")) if t not in eos)
    return declared, {
        "model_file": decoder["filename"], "context_length": model.get("context_length"),
        "eos": eos, "bos": next(iter(_ids(model.get("bos_token_id"))), None), "config": cfg,
    }


def _from_metadata(root: Path) -> tuple[DeclaredIO, dict[str, Any]]:
    import yaml  # only folders with our own metadata need it

    path = root / METADATA_FILE
    try:
        meta = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ModelLoadError(f"{path} is not valid YAML: {exc}",
                             hint="fix the file's syntax") from exc
    if not isinstance(meta, dict):
        raise ModelLoadError(f"{path} must hold a mapping",
                             hint="see docs/models.md, 'Model folders'")
    present = [k for k in _UNSUPPORTED_METADATA if meta.get(k)]
    if present:
        raise UnsupportedModelError(
            f"{path} asks for {', '.join(present)}, which this engine does not run yet",
            hint="remove those keys or use a model without them")
    warnings = [f"{path}: unknown key '{k}' ignored" for k in sorted(set(meta) - _KNOWN_METADATA)]
    io = meta.get("io") or {}
    pairs = []
    for item in meta.get("kv_pairs") or []:
        if not isinstance(item, dict) or "input" not in item or "output" not in item:
            raise ModelLoadError(f"{path}: each kv_pairs entry needs input: and output:",
                                 hint="e.g. - {input: past.0.key, output: present.0.key}")
        pairs.append((str(item["input"]), str(item["output"])))
    declared = DeclaredIO(
        input_ids=io.get("input_ids"), attention_mask=io.get("attention_mask"),
        position_ids=io.get("position_ids"), logits=io.get("logits"), kv_pairs=tuple(pairs),
        head_size=meta.get("head_size"), kv_num_heads=meta.get("kv_num_heads"),
        decode_path=meta.get("decode_path"),
    )
    model_file = meta.get("model_file") or _find_onnx(root)
    return declared, {
        "model_file": model_file, "context_length": meta.get("max_sequence_length"),
        "eos": _ids(meta.get("eos_token_ids")), "bos": meta.get("bos_token_id"),
        "warnings": warnings, "config": meta,
    }


def _from_hf(root: Path) -> tuple[DeclaredIO, dict[str, Any]]:
    cfg = _read_json(root / "config.json")
    gen_path = root / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.is_file() else {}
    eos = _ids(gen.get("eos_token_id", cfg.get("eos_token_id")))
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    head_size = cfg.get("head_dim") or (hidden // heads if heads and hidden else None)
    declared = DeclaredIO(head_size=head_size,
                          kv_num_heads=cfg.get("num_key_value_heads", heads))
    return declared, {
        "model_file": _find_onnx(root),
        "context_length": cfg.get("max_position_embeddings"),
        "eos": eos, "bos": next(iter(_ids(gen.get("bos_token_id", cfg.get("bos_token_id")))),
                                None),
        "config": cfg,
    }
