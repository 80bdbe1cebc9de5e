"""How long, and how much memory, ``import-gguf`` takes to refuse a truncated GGUF.

    python -m bench.gguf_truncated [--keep 0.2] [--root OTHER_CHECKOUT]

Writes a GGUF of a Qwen2-like shape with the ``gguf`` package's writer into a temporary
folder under /tmp (a 151,936-token vocabulary with its merges, as a real model's header
has, and ~400 MB of F16 tensors of zeros), cuts it to ``--keep`` of its length (an
interrupted download), then imports it in a fresh process and prints one JSON line: the
seconds from the call to the refusal, the process's peak RSS, and the message. ``--root``
runs another checkout's engine (an older commit in a `git worktree`) on the same file. The
folder is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB = 151_936
HIDDEN, LAYERS, FFN, KV = 896, 24, 4864, 128


def write_file(path: Path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "qwen2")
    w.add_name("truncation-bench")
    w.add_context_length(32768)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(14)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"tok{i}".encode() for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"t{i} o{i}" for i in range(VOCAB - 300)])
    w.add_eos_token_id(0)

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float16)

    w.add_tensor("token_embd.weight", zeros(VOCAB, HIDDEN))
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(b + "attn_q.weight", zeros(HIDDEN, HIDDEN))
        w.add_tensor(b + "attn_k.weight", zeros(KV, HIDDEN))
        w.add_tensor(b + "attn_v.weight", zeros(KV, HIDDEN))
        w.add_tensor(b + "attn_output.weight", zeros(HIDDEN, HIDDEN))
        w.add_tensor(b + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(b + "ffn_gate.weight", zeros(FFN // 8, HIDDEN))
        w.add_tensor(b + "ffn_up.weight", zeros(FFN // 8, HIDDEN))
        w.add_tensor(b + "ffn_down.weight", zeros(HIDDEN, FFN // 8))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def refuse(gguf: Path, out: Path) -> dict[str, object]:
    """In this fresh process: import ``gguf`` and time the refusal."""
    from engine.errors import ModelLoadError
    from engine.model.gguf import import_gguf

    start = time.perf_counter()
    try:
        import_gguf(gguf, out)
        message = "imported (not refused)"
    except ModelLoadError as exc:
        message = str(exc)
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 2),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "message": message}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", type=float, default=0.2,
                   help="the fraction of the file left after the cut (default 0.2)")
    p.add_argument("--root", type=Path, default=REPO,
                   help="checkout whose engine imports the file (default: this one)")
    p.add_argument("--refuse", nargs=2, metavar=("GGUF", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.refuse:
        print(json.dumps(refuse(Path(args.refuse[0]), Path(args.refuse[1]))))
        return 0
    with tempfile.TemporaryDirectory(prefix="gguf-truncated-", dir="/tmp") as tmp:
        gguf = Path(tmp) / "model.gguf"
        write_file(gguf)
        full = gguf.stat().st_size
        cut = int(full * args.keep)
        os.truncate(gguf, cut)
        done = subprocess.run(
            [sys.executable, __file__, "--refuse", str(gguf), str(Path(tmp) / "out")],
            cwd=args.root, capture_output=True, text=True, timeout=1800,
            env={**os.environ, "PYTHONPATH": str(args.root)})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise RuntimeError(f"the import process failed ({done.returncode}):\n"
                               f"{done.stderr[-3000:]}")
        result = json.loads(lines[-1])
    print(json.dumps({"bench": "gguf_truncated", "root": str(args.root), "full_bytes": full,
                      "cut_bytes": cut, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
