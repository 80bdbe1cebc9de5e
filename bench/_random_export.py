"""A Hugging Face model of a catalog entry's shapes with random weights, exported with
onnxruntime-genai's builder (int4, CPU). Run by ``bench/catalog_table.py`` with the Python
of a separate environment that has torch, transformers and onnxruntime-genai:

    /tmp/exportvenv/bin/python bench/_random_export.py SHAPE.json TOKENIZER_DIR OUT_DIR

``SHAPE.json``: a Hugging Face ``config.json`` (the model's public one: layers, widths,
heads, vocabulary, tied embeddings). The weights are drawn with a small spread
(``initializer_range`` 0.006) so the activations of a deep stack stay finite. The tokenizer
is ``TOKENIZER_DIR``'s (another vocabulary: the model's embedding keeps the config's size;
token ids past the tokenizer's own are never sent, and decode to nothing). The builder
writes ``OUT_DIR`` (model.onnx, model.onnx.data, genai_config.json, the tokenizer files);
the Hugging Face folder beside it (``OUT_DIR.hf``) is removed afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    shape_file, tokenizer_dir, out = (Path(a) for a in sys.argv[1:4])
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    shape = json.loads(shape_file.read_text())
    shape["initializer_range"] = 0.006
    config = AutoConfig.for_model(**shape)
    config.torch_dtype = "float32"
    torch.manual_seed(0)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    hf = out.with_name(out.name + ".hf")
    shutil.rmtree(hf, ignore_errors=True)
    model.save_pretrained(hf, safe_serialization=True)
    del model
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(hf)
    print(f"random model saved in {time.perf_counter() - start:.0f} s", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
                    "-o", str(out), "-p", "int4", "-e", "cpu",
                    "-c", str(out.with_name(out.name + ".cache"))], check=True)
    print(f"exported in {time.perf_counter() - start:.0f} s", flush=True)
    shutil.rmtree(hf, ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".cache"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
