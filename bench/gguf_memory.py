"""Memory of ``import-gguf`` on a ~1B-parameter GGUF (TinyLlama's layer shapes: 22 layers,
hidden 2048, feed-forward 5632, 4 KV heads; a 512-token vocabulary; Q4_K projections, Q6_K
output; random blocks with sane scales, made here): peak anonymous
memory (``RssAnon``: what the process itself allocated) and peak RSS (which also counts
the memory-mapped GGUF's pages as they are read: file cache the kernel can drop).

    .venv/bin/python -m bench.gguf_memory [--layers 22]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.gguf_agreement import REPO


def _anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def _convert(gguf: Path, out: Path) -> dict[str, object]:
    """The import in this (fresh) process, ``RssAnon`` sampled every 5 ms by a thread."""
    import threading

    from engine.model.gguf import import_gguf

    before = _anon_kib()
    peak = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _anon_kib())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    result = import_gguf(gguf, out)
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    return {"gguf_bytes": gguf.stat().st_size, "folder_bytes": result.bytes,
            "seconds": round(seconds, 1), "lossless": result.lossless,
            "requantized": result.requantized, "anon_before_mib": before // 1024,
            "peak_anon_mib": peak[0] // 1024,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--work", default=str(REPO / "bench/out/gguf_memory"))
    p.add_argument("--convert", nargs=2, metavar=("GGUF", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.convert:
        print(json.dumps(_convert(Path(args.convert[0]), Path(args.convert[1]))))
        return
    from gguf import GGMLQuantizationType as QT

    from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = TinySpec("llama", QT.Q4_K, layers=args.layers, hidden=2048, heads=32, kv_heads=4,
                    head_dim=64, ffn=5632, context=2048, tied=False)
    gguf = write_gguf(work / "big.gguf", spec, tokenizer_source(work))
    done = subprocess.run([sys.executable, "-m", "bench.gguf_memory", "--convert", str(gguf),
                           str(work / "out")], cwd=REPO, check=True, capture_output=True,
                          text=True, timeout=3600)
    print(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
