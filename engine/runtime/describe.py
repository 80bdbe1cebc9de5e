"""What `python -m engine inspect` reports about a model folder (no weights loaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.model.io_spec import resolve_io
from engine.model.kv16_pass import row_extra
from engine.model.model_dir import load_model_dir
from engine.runtime.cuda_graph import structural_declines
from engine.runtime.providers import pruned_graph
from engine.text.fim import detect_fim_family
from engine.text.tokenizer import Tokenizer


def inspect_model(path: str | Path) -> dict[str, Any]:
    model = load_model_dir(path)
    spec = resolve_io(model.graph.inputs, model.graph.outputs, model.declared,
                      has_gqa=model.graph.has_gqa, source=model.format)
    tokenizer = Tokenizer.from_dir(model.path)
    fim = detect_fim_family(tokenizer)
    declines = structural_declines(model.model_file, spec.decode_path)
    # what a load on the CPU would run for attention: the engine's kernel, or why not; and
    # the KV it would keep (16-bit where the kernel runs it, engine.model.kv16_pass)
    _, spec, kernel_use = pruned_graph(model.model_file, spec, EngineConfig(prune_logits=False),
                                    "cpu", model.graph.op_counts.get("GroupQueryAttention", 0),
                                    model.graph.op_counts.get("MatMulNBits", 0))
    eos = tuple(dict.fromkeys(model.eos_token_ids + tokenizer.eos_token_ids))
    heads = sorted({p.num_heads for p in spec.kv_pairs})
    dims = sorted({p.head_dim - row_extra(p.dtype) for p in spec.kv_pairs})  # less a scale
    return {
        "path": str(model.path),
        "format": model.format,
        "model_file": model.model_file.name,
        "io": spec.as_dict(),
        "decode_path": spec.decode_path,
        "context_length": model.context_length,
        "kv": {
            "layers": spec.num_layers,
            "kv_heads": heads[0] if len(heads) == 1 else heads,
            "head_dim": dims[0] if len(dims) == 1 else dims,
            "dtype": spec.kv_pairs[0].dtype if spec.kv_pairs else None,
            "bytes_per_token": spec.kv_bytes_per_token,
        },
        "eos_token_ids": list(eos),
        "bos_token_id": model.bos_token_id,
        "vocab_size": spec.vocab_size,
        "fim_family": fim.name if fim else None,
        "chat_template": tokenizer.has_chat_template,
        "quantization": model.graph.quantization,
        "weights_bytes": model.weights_bytes,
        "external_data": [e.path.name for e in model.graph.external_data],
        "top_level_control_flow": model.graph.top_level_control_flow,
        "cuda_graph_safety": {"safe": not declines, "reasons": declines},
        "engine_kernels": kernel_use.as_dict(),
        "warnings": list(model.warnings) + list(spec.convention_warnings),
    }
