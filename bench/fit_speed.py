"""Expected against measured decode speed: the catalog's figure (what a decode step reads
per second on this machine, measured here afresh as the catalog measures it once:
engine/hub/bandwidth.py; over the bytes a step reads, engine/hub/fit.py) beside what the
engine then does, for model folders given on the command line.

    python -m bench.fit_speed resources/models/smollm2-135m-instruct [FOLDER ...] [--forged]

Each folder: its weights (the files), its KV shape (``inspect``), the expected tokens/s, and
the best decode tokens/s of three greedy 128-token generations (the best: the machine
is shared) (threads: the engine's default). The per-layer cost is measured on the built-in
model, so its own row checks only that the figures are stable; the forged fp32 models
check the fp32 rate, the exports of ``python -m bench.catalog_table`` the int4 one.
``--forged`` adds two fp32 decoders forged in code (tests/forge) of other shapes: 8 layers
of 512 and 4 layers of 1024.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.hub.bandwidth import measure_speed
from engine.hub.fit import assess
from engine.hub.remote import ModelShape
from engine.runtime.describe import inspect_model


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fit_speed")
    parser.add_argument("folders", nargs="*")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--forged", action="store_true",
                        help="also two fp32 decoders forged in code")
    args = parser.parse_args()
    folders = list(args.folders)
    if args.forged:
        from tests.forge import ForgeSpec, write_genai_model

        root = Path(tempfile.mkdtemp(prefix="fit-speed-"))
        for hidden, layers, ffn in ((512, 8, 1536), (1024, 4, 4096)):
            spec = ForgeSpec(context=1024, hidden=hidden, layers=layers, intermediate=ffn,
                             heads=8, kv_heads=2, vocab=8192)
            folders.append(str(write_genai_model(root / f"forged-{hidden}x{layers}", spec,
                                                 tokenizer_vocab=512)))
    speed, name = measure_speed()
    print(f"{time.strftime('%Y-%m-%d')}  read rate {speed.bytes_per_second / 1e9:.2f} GB/s fp32, "
          f"{(speed.int4_bytes_per_second or 0) / 1e9:.2f} GB/s int4 (matrix-vector products, "
          f"the engine's threads); {speed.layer_seconds * 1e6:.0f} us per layer (measured "
          f"on {name or 'nothing'})")
    print(f"{'model':40} {'weights':>10} {'quant':>6} {'expected':>9} {'measured':>9} "
          f"{'ratio':>6}")
    for folder in folders:
        report = inspect_model(folder)
        kv = report["kv"]
        shape = ModelShape(kv["layers"], kv["kv_heads"], kv["head_dim"],
                           report["context_length"], kv["bytes_per_token"]
                           // (2 * kv["layers"] * kv["kv_heads"] * kv["head_dim"]))
        fit = assess(report["weights_bytes"], shape, EngineConfig(), bandwidth=speed,
                     quantized=report.get("quantization") not in (None, "none", "fp32",
                                                                   "fp16", "float32"))
        engine = Engine.load(folder, EngineConfig())
        engine.wait_huge_pages(timeout=30)  # as the catalog's measurement does
        quant = report.get("quantization")
        speeds = []
        for seed in range(3):
            result = engine.generate(GenerateRequest(
                prompt=f"Write a story number {seed}.", options=GenerateOptions(
                    max_new_tokens=args.tokens, temperature=0.0, stop_on_eos=False,
                    speculative_mode="none")))  # a decode step's speed, not lookup's
            speeds.append(result.timings.decode_tok_s)
        measured = max(speeds)
        expected = fit.tokens_per_second or 0.0
        print(f"{folder[-40:]:40} {report['weights_bytes'] / 2**20:9.1f}M {quant!s:>6} "
              f"{expected:9.1f} "
              f"{measured:9.1f} {measured / expected if expected else 0:6.2f}")


if __name__ == "__main__":
    main()
