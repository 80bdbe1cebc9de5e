"""The training loop: AdamW, warmup + cosine schedule, loss log, checkpoints, resume."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tools.default_model.model import Decoder
from tools.default_model.samples import SampleBuilder


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1800
    batch: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1234
    log_every: int = 10
    eval_every: int = 100
    checkpoint_every: int = 100
    bf16: bool = True  # autocast matmuls to bfloat16 (weights, optimizer and loss in fp32)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_optimizer(model: Decoder, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def lm_loss(model: Decoder, batch: torch.Tensor,
            weights: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy; with ``weights`` (aligned with ``batch``), their weighted
    mean (``weights[:, i]`` weighs the prediction of ``batch[:, i]``)."""
    logits = model(batch[:, :-1]).float()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1),
                          reduction="none")
    if weights is None:
        return nll.mean()
    w = weights[:, 1:].reshape(-1)
    return (nll * w).sum() / w.sum()


@torch.no_grad()
def eval_loss(model: Decoder, rows: torch.Tensor) -> float:
    model.eval()
    losses = [float(lm_loss(model, rows[i:i + 4])) for i in range(0, len(rows), 4)]
    model.train()
    return float(np.mean(losses))


def _save(path: Path, model: Decoder, opt: torch.optim.Optimizer, builder: SampleBuilder,
          step: int, history: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "rng": builder.rng.bit_generator.state, "history": history}, tmp)
    tmp.replace(path)


def train(model: Decoder, builder: SampleBuilder, heldout_rows: torch.Tensor,
          cfg: TrainConfig, work_dir: Path, resume: bool = False) -> list[dict[str, Any]]:
    """Train ``cfg.steps`` steps; logs JSON lines to ``work_dir/train_log.jsonl``."""
    opt = make_optimizer(model, cfg)
    ckpt = work_dir / "checkpoint.pt"
    history: list[dict[str, Any]] = []
    start = 0
    if resume and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        builder.rng.bit_generator.state = state["rng"]
        start, history = state["step"], state["history"]
        print(f"resumed at step {start}", flush=True)
    log = (work_dir / "train_log.jsonl").open("w", encoding="utf-8")
    log.writelines(json.dumps(entry) + "\n" for entry in history)  # up to the resume point
    (work_dir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    model.train()
    offset = float(history[-1]["elapsed_s"]) if history else 0.0  # time before a resume
    began, window_loss, window_tokens, window_start = time.time(), [], 0, time.time()
    for step in range(start, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        ids, weights = builder.batch(cfg.batch)
        batch = torch.from_numpy(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = lm_loss(model, batch, torch.from_numpy(weights))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window_loss.append(loss.item())
        window_tokens += batch.shape[0] * (batch.shape[1] - 1)
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            entry: dict[str, Any] = {
                "step": done, "loss": round(float(np.mean(window_loss)), 4),
                "lr": round(lr_at(step, cfg), 6),
                "tok_s": round(window_tokens / (time.time() - window_start), 1),
                "elapsed_s": round(offset + time.time() - began, 1)}
            if done % cfg.eval_every == 0 or done == cfg.steps:
                entry["heldout_loss"] = round(eval_loss(model, heldout_rows), 4)
            history.append(entry)
            log.write(json.dumps(entry) + "\n")
            log.flush()
            print(json.dumps(entry), flush=True)
            window_loss, window_tokens, window_start = [], 0, time.time()
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            _save(ckpt, model, opt, builder, done, history)
    log.close()
    return history
