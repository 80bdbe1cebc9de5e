"""Train the default code model and export it to ``tools/models/default-coder``.

A development tool (needs PyTorch, CPU is enough; not an app dependency). From the
repository root::

    .venv/bin/python -m tools.train_default_model            # full run (~30 min, 2 cores)
    .venv/bin/python -m tools.train_default_model --steps 60 --out /tmp/smoke --work-dir /tmp/w

Deterministic for a given ``--seed`` on the same interpreter (same stdlib files), the same
thread count and the same PyTorch build.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Idle OpenMP threads sleep instead of spinning: on a busy 2-core machine spinning threads
# wait for each other's time slices. Read when torch loads; does not change the numbers.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tools.default_model.corpus import chat_examples, edit_examples, load_corpus  # noqa: E402
from tools.default_model.export import export_model  # noqa: E402
from tools.default_model.model import Decoder, ModelConfig  # noqa: E402
from tools.default_model.samples import Mix, SampleBuilder  # noqa: E402
from tools.default_model.tokenizer import train_tokenizer  # noqa: E402
from tools.default_model.train import TrainConfig, train  # noqa: E402

DEFAULT_OUT = ROOT / "tools" / "models" / "default-coder"


def _args(argv: list[str] | None) -> argparse.Namespace:
    d_model, d_train = ModelConfig(), TrainConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/default-coder-train"))
    p.add_argument("--resume", action="store_true", help="continue from work-dir's checkpoint")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from the weights of this checkpoint.pt (same model config and "
                        "tokenizer), with a fresh optimizer and schedule: a fine-tune")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--edit-share", type=float, default=0.0,
                   help="share of samples that are rename edits, taken from the FIM share "
                        "(tried at 0.07: plain completions then write such rename comments; "
                        "see bench/README.md)")
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms (15%% slower here; the CPU "
                        "kernels used give the same losses without it)")
    for name, value in [*vars(d_model).items(), *vars(d_train).items()]:
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(flag, type=type(value), default=value)
    return p.parse_args(argv)


def _configs(ns: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    model_keys, train_keys = vars(ModelConfig()).keys(), vars(TrainConfig()).keys()
    return (ModelConfig(**{k: getattr(ns, k) for k in model_keys}),
            TrainConfig(**{k: getattr(ns, k) for k in train_keys}))


def _seed_everything(seed: int, threads: int, deterministic: bool) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(deterministic)


def main(argv: list[str] | None = None) -> int:
    ns = _args(argv)
    if not 0.0 <= ns.edit_share <= Mix().fim:
        raise SystemExit(f"--edit-share takes its samples from the FIM share: expected 0 to "
                         f"{Mix().fim}, got {ns.edit_share}")
    model_cfg, train_cfg = _configs(ns)
    _seed_everything(train_cfg.seed, ns.threads, ns.deterministic)
    ns.work_dir.mkdir(parents=True, exist_ok=True)
    began = time.time()
    corpus = load_corpus()
    tok = train_tokenizer(corpus.train, model_cfg.vocab)
    print(f"corpus: {len(corpus.train)} train / {len(corpus.heldout)} held-out files; "
          f"tokenizer {tok.get_vocab_size()} ({time.time() - began:.1f}s)", flush=True)
    chat = chat_examples(corpus.train)
    edits = edit_examples(corpus.train) if ns.edit_share else []  # 2-3 s of parsing
    mix = Mix(fim=Mix().fim - ns.edit_share, edit=ns.edit_share)
    builder = SampleBuilder(tok, corpus.train, chat, train_cfg.seq_len, train_cfg.seed, mix,
                            edits=edits)
    # fixed plain-code rows of the held-out files, from their own generator
    held = SampleBuilder(tok, corpus.heldout, [], train_cfg.seq_len, train_cfg.seed + 1,
                         Mix(fim=0.0, chat=0.0))
    heldout_rows = torch.from_numpy(held.batch(16)[0])
    model = Decoder(model_cfg)
    if ns.init_from is not None:
        model.load_state_dict(torch.load(ns.init_from, weights_only=False)["model"])
        print(f"weights from {ns.init_from}", flush=True)
    print(f"model: {model.num_parameters():,} parameters {model_cfg.as_dict()}", flush=True)
    history = train(model, builder, heldout_rows, train_cfg, ns.work_dir, resume=ns.resume)
    out = export_model(model, tok, ns.out)
    summary = {"model": model_cfg.as_dict(), "train": vars(train_cfg),
               "parameters": model.num_parameters(), "chat_examples": len(chat),
               "edit_examples": len(edits),
               "train_files": len(corpus.train), "heldout_files": len(corpus.heldout),
               "process_wall_s": round(time.time() - began, 1),
               "train_s": history[-1]["elapsed_s"] if history else 0.0,
               "final": history[-1] if history else {},
               "init_from": str(ns.init_from) if ns.init_from else None,
               "mix": asdict(builder.mix), "threads": ns.threads, "torch": torch.__version__,
               "python": sys.version.split()[0]}
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"exported": str(out), **summary["final"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
