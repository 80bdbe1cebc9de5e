"""One-line code completion as editors ask for it: ``/infill`` with ``"stop": ["\\n"]``.

Holes come from held-out files of Python's standard library (``tools.default_model.corpus``:
one file in 20 by the hash of its path, never trained on here): the cursor sits after a
line's indentation, the hole is the rest of that line, the suffix is everything after it.
Each hole is sent twice to a fresh worker on the built-in model (greedy, 32 tokens at
most): with ``stop: ["\\n"]`` and without a stop. The report counts non-empty answers and
exact first lines for both.

    python -m bench.infill_line_stop [--holes 100] [--seed 7] [--model DIR] [--threads 2]

Writes bench/out/infill_line_stop.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
MODEL = REPO / "resources" / "models" / "smollm2-135m-instruct"
#: Characters of the file kept before the cursor (the worker clips to its own budget too).
PREFIX_CHARS = 3000
SUFFIX_CHARS = 1500


def holes(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` holes from held-out stdlib files: (file, prefix, middle, suffix)."""
    from tools.default_model.corpus import load_corpus

    files = load_corpus().heldout
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    tries = 0
    while len(out) < count and tries < count * 50:
        tries += 1
        item = files[rng.randrange(len(files))]
        lines = item.text.split("\n")
        if len(lines) < 10:
            continue
        index = rng.randrange(5, len(lines) - 1)
        line = lines[index]
        body = line.lstrip(" \t")
        if len(body.strip()) < 4 or body.startswith("#"):
            continue
        indent = line[:len(line) - len(body)]
        before = "\n".join(lines[:index]) + "\n" + indent
        after = "\n" + "\n".join(lines[index + 1:])
        out.append({"file": item.path, "prefix": before[-PREFIX_CHARS:], "middle": body,
                    "suffix": after[:SUFFIX_CHARS]})
    return out


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
    return answer


def _own_home(folder: Path) -> dict[str, str]:
    """The worker's log, cache and settings go to ``folder``, not the user's home."""
    return {"HOME": str(folder), **{f"XDG_{kind}_HOME": str(folder / kind.lower())
                                    for kind in ("CACHE", "CONFIG", "DATA", "STATE")}}


def run(model: Path, count: int, seed: int, threads: int) -> dict[str, Any]:
    cases = holes(count, seed)
    home = tempfile.TemporaryDirectory(prefix="infill-line-stop-")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model),
                             "--port", "0", "--threads", str(threads), "--no-kv-store"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                                           **_own_home(Path(home.name))})
    rows = []
    started = time.perf_counter()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the worker did not start")
        url = json.loads(line)["url"]
        for case in cases:
            body = {"input_prefix": case["prefix"], "input_suffix": case["suffix"],
                    "n_predict": 32, "temperature": 0, "cache_prompt": True}
            with_stop = _post(url + "/infill", {**body, "stop": ["\n"]})["content"]
            without = _post(url + "/infill", body)["content"]
            rows.append({"file": case["file"], "middle": case["middle"],
                         "with_stop": with_stop, "without_stop": without})
    finally:
        proc.terminate()
        proc.wait(30)
        home.cleanup()

    def first_line(text: str) -> str:
        return text.split("\n", 1)[0].strip()

    def summary(key: str) -> dict[str, int]:
        return {"non_empty": sum(bool(r[key].strip()) for r in rows),
                "exact_line": sum(first_line(r[key]) == r["middle"].strip() for r in rows)}

    return {"model": model.name, "holes": len(rows), "seed": seed,
            "seconds": round(time.perf_counter() - started, 1),
            "with_stop": summary("with_stop"), "without_stop": summary("without_stop"),
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not 1 <= args.holes <= 1000:
        parser.error("--holes: expected 1 to 1000")
    report = run(args.model, args.holes, args.seed, args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "infill_line_stop.json").write_text(json.dumps(report, indent=1) + "\n")
    n = report["holes"]
    for key in ("with_stop", "without_stop"):
        s = report[key]
        print(f"{key:>13}: non-empty {s['non_empty']}/{n}, exact first line "
              f"{s['exact_line']}/{n}")
    print(f"{report['seconds']} s; bench/out/infill_line_stop.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
