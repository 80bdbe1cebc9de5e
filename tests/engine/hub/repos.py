"""Hub repositories for the pull and fit tests, as real folders the stand-in serves: a
forged GGUF decoder in four quantizations, a forged onnxruntime-genai model, and a
repository holding nothing this engine runs."""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGMLQuantizationType as QT

from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf
from tests.forge import ForgeSpec, write_genai_model

GGUF_REPO = "forge/Tiny-GGUF"
ONNX_REPO = "forge/tiny-onnx"
UNSUPPORTED_REPO = "forge/safetensors-only"
#: name in the repository -> type of its projections (the Q4_K_M file is Q4_K with a Q6_K
#: output, as llama.cpp writes them)
QUANTS = {"Tiny-Q4_0.gguf": QT.Q4_0, "Tiny-Q4_K_M.gguf": QT.Q4_K, "Tiny-Q6_K.gguf": QT.Q6_K,
          "Tiny-Q8_0.gguf": QT.Q8_0}
GGUF_SPEC = dict(arch="qwen2", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                 ffn=512, context=256, tied=False)


def gguf_repo(root: Path) -> Path:
    folder = root / "gguf-repo"
    folder.mkdir(parents=True)
    tok = tokenizer_source(root)
    for name, qtype in QUANTS.items():
        write_gguf(folder / name, TinySpec(qtype=qtype, **GGUF_SPEC), tok)  # type: ignore[arg-type]
    (folder / "README.md").write_text("A tiny forged decoder in four quantizations.\n")
    return folder


def onnx_repo(root: Path, spec: ForgeSpec) -> Path:
    return write_genai_model(root / "onnx-repo", spec)


def unsupported_repo(root: Path) -> Path:
    folder = root / "safetensors-repo"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 20_000)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return folder
