#!/usr/bin/env bash
# The edit-tuned copy of the default model that bench/speculative.py's edit target is
# measured on (bench/README.md, "Speculative decoding"). Not shipped: its plain completions
# drift into rename requests. About 75 minutes on 2 cores in all; every stage is seeded.
#
#   tools/train_edit_bench_model.sh [WORK]      (WORK defaults to /tmp/edit-bench)
#   .venv/bin/python -m bench.speculative --model WORK/stage3/model --rounds 20 --new-tokens 400
#
# Stage 0 is the default model's own run (the command in its MODEL_CARD.md); stages 1-3
# fine-tune it on rename edits (a function, "the same function, with `x` renamed to `y`",
# the rewrite) with --init-from: 50% then 70% of the samples, 2,000 steps in all.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="${1:-/tmp/edit-bench}"
cd "$ROOT"
train() { "$PY" -m tools.train_default_model "$@"; }

[ -f "$WORK/stage0/checkpoint.pt" ] || \
  train --work-dir "$WORK/stage0" --out "$WORK/stage0/model"
train --init-from "$WORK/stage0/checkpoint.pt" --edit-share 0.5 --steps 500 --lr 0.001 \
  --warmup 20 --work-dir "$WORK/stage1" --out "$WORK/stage1/model"
train --init-from "$WORK/stage1/checkpoint.pt" --edit-share 0.7 --steps 700 --lr 0.0015 \
  --warmup 20 --seed 4321 --work-dir "$WORK/stage2" --out "$WORK/stage2/model"
train --init-from "$WORK/stage2/checkpoint.pt" --edit-share 0.7 --steps 800 --lr 0.001 \
  --warmup 20 --seed 999 --work-dir "$WORK/stage3" --out "$WORK/stage3/model"
echo "edit bench model: $WORK/stage3/model"
