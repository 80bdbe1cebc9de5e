"""The worker's memory for a short answer, with and without max_tokens.

    python -m bench.kv_reservation [--root OTHER_CHECKOUT]

For each case a fresh ``python -m engine serve`` on 127.0.0.1 with the built-in model
(resources/models/smollm2-135m-instruct), one chat request at temperature 0, the worker's
resident set (VmRSS) read after its ready line and after the answer. Cases: no max_tokens
(the answer is bounded by the context alone) and max_tokens 64. Prints one JSON line per
case. ``--root`` runs another checkout's engine (an older commit in a `git worktree`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench._serve import REPO, worker

PROMPT = "Describe the sea in two sentences."  # 31 tokens from the built-in model


def case(max_tokens: int | None, root: Path) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT}],
                            "temperature": 0}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    with worker("--threads", "2", root=root) as w:
        time.sleep(2.0)  # start-up work settles
        before = w.rss_mib()
        answer = httpx.post(w.url + "/v1/chat/completions", json=body, timeout=600).json()
        time.sleep(1.0)
        after = w.rss_mib()
    choice = answer["choices"][0]
    return {"bench": "kv_reservation", "root": str(root), "max_tokens": max_tokens,
            "completion_tokens": answer["usage"]["completion_tokens"],
            "finish_reason": choice["finish_reason"], "rss_before_mib": round(before),
            "rss_after_mib": round(after), "growth_mib": round(after - before)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=REPO,
                   help="checkout whose engine the worker runs (default: this one)")
    args = p.parse_args()
    for max_tokens in (None, 64):
        print(json.dumps(case(max_tokens, args.root)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
