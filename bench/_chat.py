"""A chat of held-out text for the worker benchmarks (``shift_reuse.py``, ``chat_turns.py``).

The text is this repository's own docs, cut at paragraph ends; requests are streamed and
timed to the first content byte.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "resources" / "models" / "smollm2-135m-instruct"
SYSTEM = "You are a helpful assistant who answers questions about a software project."


def tokenizer() -> Any:
    from engine.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(MODEL)


def chat_texts(tok: Any, turns: int, tokens: int) -> list[str]:
    """`turns` pieces of this repository's docs, each ~`tokens` tokens, cut at a paragraph."""
    paragraphs: list[str] = []
    for path in sorted((REPO / "docs").glob("*.md")) + [REPO / "engine" / "README.md"]:
        paragraphs += [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    out, current, count = [], [], 0
    for para in paragraphs:
        current.append(para)
        count += len(tok.encode(para, parse_special=False))
        if count >= tokens:
            out.append("Here is part of a document:\n\n" + "\n\n".join(current)
                       + "\n\nWhat does this part say? Answer in two sentences.")
            current, count = [], 0
            if len(out) == turns:
                return out
    raise RuntimeError("not enough text in docs/ for the chat")


def stream(http: Any, path: str, body: dict[str, Any],
           headers: dict[str, str] | None = None, need_usage: bool = True) -> dict[str, Any]:
    """POST a streamed request: TTFT (first content), the text, and the usage
    (``prompt_tokens`` and ``cached_tokens`` None where the server sends none and
    `need_usage` is false)."""
    start = time.perf_counter()
    ttft, text, usage = None, [], None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", path, json=body, headers=headers or {}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content") or choice.get("text") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - start
                text.append(piece)
    if usage is None and need_usage:
        raise RuntimeError(f"no usage in the stream of {path}")
    return {"ttft_s": round(ttft if ttft is not None else time.perf_counter() - start, 3),
            "prompt_tokens": None if usage is None else usage["prompt_tokens"],
            "cached_tokens": None if usage is None else
            usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
            "text": "".join(text)}


def vm_hwm_mib(pid: int) -> float:
    """Peak resident set (VmHWM) of process `pid` so far, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")
