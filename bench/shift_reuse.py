"""Reuse by shifting (``--cache-reuse``) on the built-in model, through the worker.

Two arms, each a fresh ``python -m engine serve`` worker: ``shift`` (``--cache-reuse 256``,
the default) and ``off`` (``--cache-reuse 0``: what the engine did before, every token
after the common prefix recomputed).

- **Chat** (the app's path: ``X-Session-Id``, streamed, greedy): a system message and four
  user turns of ~1,500 tokens each (held-out text: this repository's own docs, cut at
  paragraph ends), answers of ``--answer-tokens``; then a fifth turn with the oldest
  exchange left out (what "Leave older messages out" sends) and a new message of
  ``--last-tokens``. Reported: each turn's prompt tokens, tokens reused (``cached_tokens``),
  TTFT (first streamed content), and the fifth turn's TTFT over the fourth's (target
  <= 0.5).
- **Editor, a file larger than the context** (this repository's engine sources, one after
  another, cursor in the middle): llama.vim's ``/infill`` (256 lines before the cursor's
  line, 64 after), and a client sending the last ``--window-tokens`` tokens before the
  cursor to ``/v1/completions``. Requests: cold, one character typed (``edit``), Enter
  typed (``newline``: the window moves one line), and for the second the cursor
  ``--move-lines`` lines down (``move``). Reported: prompt tokens, tokens prefilled
  (prompt - cached) and their share of the cold prompt (target <= 10%).
- **Answers**: each shifted answer against the ``off`` arm's (a full recompute of the
  tokens that moved): tokens that agree and the first that differs.

    .venv/bin/python -m bench.shift_reuse [--threads 2] [--answer-tokens 32]
    .venv/bin/python -m bench.shift_reuse --forge   # agreement cases only

Writes bench/out/shift_reuse.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._chat import MODEL, SYSTEM, chat_texts  # noqa: E402
from bench._chat import stream as _stream  # noqa: E402
from bench._chat import tokenizer as _tokenizer  # noqa: E402
from bench._serve import worker  # noqa: E402

OUT = REPO / "bench" / "out"
#: Arms: name -> --cache-reuse (``shift64``: a smaller minimum run, for small prompts).
ARMS = {"shift": "256", "off": "0", "shift64": "64"}


def source_file() -> str:
    """This repository's engine sources, one after another: a file far over the context."""
    files = sorted((REPO / "engine").rglob("*.py"))
    return "".join(f"# --- {p.relative_to(REPO)} ---\n{p.read_text(encoding='utf-8')}"
                   for p in files)


def editor_requests(tok: Any, window_tokens: int, move_lines: int
                    ) -> list[tuple[str, str, dict[str, Any]]]:
    """(route, label, body) of an editor's requests around a cursor in the middle of
    `source_file()`: llama.vim's /infill (256 lines before the cursor's line, 64 after),
    then a client that sends the last `window_tokens` tokens before the cursor to
    /v1/completions. Each: cold, one character typed, Enter typed (the window moves one
    line), and (completions) the cursor `move_lines` lines further down."""
    lines = source_file().splitlines(keepends=True)
    c = len(lines) // 2  # and 3/4 for the completions' window: no text shared with /infill

    def infill(line: int, typed: str) -> dict[str, Any]:
        return {"input_prefix": "".join(lines[max(0, line - 256):line]), "prompt": typed,
                "input_suffix": "".join(lines[line + 1:line + 65])}

    def window(line: int, typed: str) -> dict[str, Any]:
        ids = tok.encode("".join(lines[:line]) + typed, parse_special=False)
        cut = tok.decode(ids[-window_tokens:])
        return {"prompt": cut[cut.find("\n") + 1:]}  # from a line start

    d = 3 * len(lines) // 4
    return [("/infill", "cold", infill(c, "    resul")),
            ("/infill", "edit", infill(c, "    result")),
            ("/infill", "newline", {**infill(c + 1, ""), "input_prefix": "".join(
                lines[c - 255:c]) + "    result\n"}),
            ("/v1/completions", "cold", window(d, "    resul")),
            ("/v1/completions", "edit", window(d, "    result")),
            ("/v1/completions", "newline", window(d + 1, "")),
            ("/v1/completions", "move", window(d + move_lines, "    resul"))]


def _infill(http: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/infill", json=body)
    response.raise_for_status()
    got = response.json()
    return {"ttft_s": round(got["timings"]["prompt_ms"] / 1e3, 3),
            "prompt_tokens": got["tokens_evaluated"], "cached_tokens": got["tokens_cached"],
            "text": got["content"]}


def run_arm(arm: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    tok = _tokenizer()
    texts = chat_texts(tok, 5, args.turn_tokens)
    last = texts[4] if args.last_tokens >= args.turn_tokens else \
        "Which parts of the project did we talk about? Answer in one sentence."
    greedy = {"temperature": 0, "max_tokens": args.answer_tokens}
    out: dict[str, Any] = {"chat": [], "editor": []}
    with worker("--model", str(MODEL), "--threads", str(threads),
                "--cache-reuse", ARMS[arm]) as w, \
            httpx.Client(base_url=w.url, timeout=600) as http:
        session = {"X-Session-Id": f"bench-{arm}"}
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for i in range(4):
            messages.append({"role": "user", "content": texts[i]})
            got = _stream(http, "/v1/chat/completions", {"messages": messages, **greedy},
                          session)
            messages.append({"role": "assistant", "content": got["text"]})
            out["chat"].append({"turn": i + 1, **got})
        left_out = [messages[0], *messages[3:], {"role": "user", "content": last}]
        got = _stream(http, "/v1/chat/completions",
                      {"messages": left_out, **greedy, "max_tokens": args.compare_tokens},
                      session)
        out["chat"].append({"turn": "5 (oldest exchange left out)", **got})
        for route, label, body in editor_requests(tok, args.window_tokens, args.move_lines):
            if route == "/infill":
                got = _infill(http, {**body, "temperature": 0,
                                     "n_predict": args.compare_tokens})
            else:
                got = _stream(http, route, {**body, "temperature": 0,
                                            "max_tokens": args.compare_tokens})
            out["editor"].append({"request": f"{route} {label}", **got})
        out["rss_mib"] = round(w.rss_mib(), 1)
    return out


def agreement(tok: Any, a: str, b: str) -> dict[str, Any]:
    ta, tb = tok.encode(a, parse_special=False), tok.encode(b, parse_special=False)
    same = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
                min(len(ta), len(tb)))
    return {"tokens_agree": same, "of": max(len(ta), len(tb)),
            "first_differing": None if same == max(len(ta), len(tb)) else same,
            "shift": tok.decode(ta[same:same + 8]), "recompute": tok.decode(tb[same:same + 8])}


def forge_agreement(tokens: int = 24) -> dict[str, Any]:
    """Greedy agreement, shifted against recomputed: on forged models (random weights) of
    one, two and four layers (700 tokens, then the first 4 kept, the next 300 left out, 20
    new), and on the built-in model (sources of this repository)."""
    import tempfile

    import numpy as np

    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
    from tests.forge import ForgeSpec, write_genai_model

    doc = [int(i) for i in np.random.default_rng(1).integers(9, 500, 900)]
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=tokens)
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-forge-") as tmp:
        for layers in (1, 2, 4):
            folder = write_genai_model(Path(tmp) / f"l{layers}",
                                       ForgeSpec(layers=layers, context=1024))
            rows = []
            for seed in range(5):
                order = np.random.default_rng(seed).permutation(doc).tolist()
                first, second = order[:700], order[:4] + order[304:720]
                warm = Engine.load(folder, EngineConfig(intra_op_threads=1))
                warm.generate(GenerateRequest(token_ids=tuple(first), options=opts))
                a = warm.generate(GenerateRequest(token_ids=tuple(second), options=opts))
                cold = Engine.load(folder, EngineConfig(intra_op_threads=1, cache_reuse=0))
                b = cold.generate(GenerateRequest(token_ids=tuple(second), options=opts))
                rows.append(next((i for i, (x, y) in enumerate(
                    zip(a.token_ids, b.token_ids, strict=True)) if x != y), tokens))
            out[f"forged, {layers} layer(s)"] = {"tokens_agree_per_case": rows, "of": tokens}
    # the built-in model: five pieces of this repository's sources, 1,200 tokens after a
    # 30-token header; then the header, the piece without its first 300 tokens, 20 new
    tok = _tokenizer()
    ids = tok.encode(source_file(), parse_special=False)
    header = tok.encode(SYSTEM, parse_special=False)[:30]
    rows = []
    warm = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    cold = Engine.load(MODEL, EngineConfig(intra_op_threads=2, cache_reuse=0,
                                           prefix_cache=False))
    for case in range(5):
        at = 20000 + 15000 * case
        first = header + ids[at:at + 1200]
        second = header + ids[at + 300:at + 1220]
        warm.generate(GenerateRequest(token_ids=tuple(first), options=opts))
        a = warm.generate(GenerateRequest(token_ids=tuple(second), options=opts))
        assert a.prefix_cache_hit_len >= len(header) + 900, a.prefix_cache_hit_len
        b = cold.generate(GenerateRequest(token_ids=tuple(second), options=opts))
        rows.append(next((i for i, (x, y) in enumerate(
            zip(a.token_ids, b.token_ids, strict=True)) if x != y), tokens))
    out["built-in model"] = {"tokens_agree_per_case": rows, "of": tokens}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turn-tokens", type=int, default=1500)
    parser.add_argument("--last-tokens", type=int, default=20,
                        help="the fifth message: a short question (or, at --turn-tokens or "
                             "more, another document part)")
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--compare-tokens", type=int, default=64)
    parser.add_argument("--window-tokens", type=int, default=6000)
    parser.add_argument("--move-lines", type=int, default=40)
    parser.add_argument("--arms", default="shift,off")
    parser.add_argument("--forge", action="store_true",
                        help="only the greedy agreement cases (forged and built-in models)")
    args = parser.parse_args(argv)
    if args.forge:
        print(json.dumps(forge_agreement(), indent=1))
        return 0
    tok = _tokenizer()
    results = {arm: run_arm(arm, args.threads, args) for arm in args.arms.split(",")}
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "machine": f"{platform.machine()} {platform.node()}",
                              "command": "python -m bench.shift_reuse " + " ".join(
                                  argv if argv is not None else sys.argv[1:]),
                              "arms": results}
    for arm, res in results.items():
        chat = res["chat"]
        report[f"{arm}_turn5_over_turn4"] = round(chat[4]["ttft_s"] / chat[3]["ttft_s"], 3)
        colds = {e["request"].split()[0]: e["prompt_tokens"] for e in res["editor"]
                 if e["request"].endswith(" cold")}
        report[f"{arm}_editor_prefilled_share"] = {
            e["request"]: round((e["prompt_tokens"] - e["cached_tokens"])
                                / colds[e["request"].split()[0]], 4)
            for e in res["editor"] if not e["request"].endswith(" cold")}
    if "shift" in results and "off" in results:
        report["answers"] = {
            "chat_turn5": agreement(tok, results["shift"]["chat"][4]["text"],
                                    results["off"]["chat"][4]["text"]),
            **{f"editor_{s['request']}": agreement(tok, s["text"], o["text"])
               for s, o in zip(results["shift"]["editor"], results["off"]["editor"],
                               strict=True)}}
    OUT.mkdir(exist_ok=True)
    (OUT / "shift_reuse.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    for arm, res in results.items():
        print(f"[{arm}]")
        for row in res["chat"]:
            print(f"  chat turn {row['turn']}: prompt {row['prompt_tokens']}, reused "
                  f"{row['cached_tokens']}, TTFT {row['ttft_s']:.2f} s")
        for row in res["editor"]:
            print(f"  editor {row['request']}: prompt {row['prompt_tokens']}, prefilled "
                  f"{row['prompt_tokens'] - row['cached_tokens']}, TTFT {row['ttft_s']:.2f} s")
        print(f"  turn 5 / turn 4 TTFT: {report[f'{arm}_turn5_over_turn4']}; editor "
              f"prefilled / cold prompt: {report[f'{arm}_editor_prefilled_share']}; "
              f"peak RSS now {res['rss_mib']} MiB")
    if "answers" in report:
        print("answers, shift vs off:", json.dumps(report["answers"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
