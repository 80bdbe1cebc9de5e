"""The defaults table: what the worker applies to a bare request, and where it came from.

For each model below a real worker (in this process, on a loopback socket) gets a bare
request on every dialect (only the prompt or messages, no sampling field), streamed and
dropped after its first few tokens. The table shows the options the engine received
(recorded where the routes hand requests to the engine thread) and the source of each
value as the worker's routes report it (``/v1/models`` ``meta.sampling``, ``/props``,
``/api/show``):

- the built-in model (its ``generation_config.json``);
- the built-in model with a user preset (``presets.json``: temperature 0.7, num_predict
  24, and an ``infill`` entry);
- a forged model whose ``genai_config.json`` holds only the builder's boilerplate (each
  dialect's own defaults apply).

    python -m bench.sampling_defaults [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PROMPT = "Say hello in three words."
COLUMNS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
SHORT = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
         "repetition_penalty": "rep", "max_new_tokens": "max_new"}
#: Each dialect's bare request: (label, path, body, where its sources are read).
REQUESTS: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("OpenAI /v1/chat/completions", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": PROMPT}], "stream": True}, "openai"),
    ("llama.cpp /completion", "/completion", {"prompt": PROMPT, "stream": True}, "llamacpp"),
    ("Ollama /api/chat", "/api/chat",
     {"messages": [{"role": "user", "content": PROMPT}], "stream": True}, "ollama"),
    ("llama.cpp /infill", "/infill",
     {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "stream": True},
     "infill"),
)
#: Tokens read from each stream before it is dropped (the options are known at submit).
READ_TOKENS = 12


def _sources(http: Any, model: str) -> dict[str, dict[str, Any]]:
    card = http.get("/v1/models").json()["data"][0]["meta"]
    props = http.get("/props").json()["default_generation_settings"]
    show = http.post("/api/show", json={"model": model}).json()
    return {"openai": card["sampling"], "llamacpp": props["sampling"],
            "ollama": show["sampling"], "infill": props["infill"]}


def _text(event: Any) -> str:
    if not isinstance(event, dict):
        return ""
    if "choices" in event:
        delta = event["choices"][0].get("delta") or {}
        return str(delta.get("content") or "")
    if "message" in event:
        return str((event.get("message") or {}).get("content") or "")
    return str(event.get("content") or "")


def _events(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        line = line.removeprefix("data: ").strip()
        if not line or line == "[DONE]":
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue


def run_model(label: str, folder: Path, presets: Path | None) -> list[dict[str, Any]]:
    from tests.engine.server.live import serve

    live = serve(folder, presets=presets)
    seen: list[Any] = []
    submit = live.ctx.submit

    def recording(model: Any, request: Any, **kwargs: Any) -> Any:
        seen.append(request.options)
        return submit(model, request, **kwargs)

    live.ctx.submit = recording  # type: ignore[method-assign]
    rows = []
    try:
        with live.client() as http:
            model_id = http.get("/v1/models").json()["data"][0]["id"]
            sources = _sources(http, model_id)
            for dialect, path, body, where in REQUESTS:
                text = ""
                with http.stream("POST", path, json=body) as response:
                    if response.status_code != 200:
                        raise RuntimeError(f"{path}: {response.status_code} "
                                           f"{response.read().decode()[:300]}")
                    for count, event in enumerate(_events(response.iter_lines())):
                        text += _text(event)
                        if count >= READ_TOKENS:
                            break
                live.wait_idle()
                options = seen[-1]
                applied = {name: getattr(options, name) for name in COLUMNS}
                source = {name: sources[where].get(name, {}).get("source", "-")
                          for name in COLUMNS}
                max_source = sources[where].get("max_tokens", {}).get("source")
                source["max_new_tokens"] = max_source or "the rest of the context"
                shown = {name: sources[where].get(name, {}).get("value") for name in COLUMNS}
                # a prefix-only infill (a model without FIM tokens) hands top-k/top-p/min-p
                # to its line-start sampler (engine.generation.fim_sampler): not in the options
                compared = ("temperature", "repetition_penalty") if where == "infill" else \
                    [n for n in COLUMNS if n != "max_new_tokens"]
                agree = all(shown[n] is None or abs(float(shown[n]) - float(applied[n])) < 1e-9
                            for n in compared)
                rows.append({"model": label, "dialect": dialect, "applied": applied,
                             "source": source, "routes_agree": agree,
                             "answer_start": text[:60]})
    finally:
        live.stop()
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    head = f"{'model':<34} {'bare request to':<28} " + " ".join(
        f"{SHORT[c]:>8}" for c in COLUMNS)
    print(head)
    print("-" * len(head))
    for row in rows:
        values = " ".join(f"{row['applied'][c]:>8g}" for c in COLUMNS)
        print(f"{row['model']:<34} {row['dialect']:<28} {values}")
        by_source: dict[str, list[str]] = {}
        for column in COLUMNS:
            by_source.setdefault(row["source"][column], []).append(SHORT[column])
        where = "; ".join(f"{', '.join(cols)} <- {src}" for src, cols in by_source.items())
        print(f"{'':<34}   from: {where}")
        print(f"{'':<34}   routes show the same values: {'yes' if row['routes_agree'] else 'NO'}"
              f"; answer began {row['answer_start']!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sampling_defaults",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args(argv)
    from engine.model.default_model import default_model_dir
    from tests.forge import ForgeSpec, write_genai_model

    builtin = default_model_dir()
    if builtin is None:
        print("the built-in model is not installed (resources/models)", file=sys.stderr)
        return 1
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sampling-defaults-") as tmp:
        presets = Path(tmp) / "presets.json"
        presets.write_text(json.dumps({builtin.name: {
            "temperature": 0.7, "num_predict": 24, "infill": {"temperature": 0.1}}}),
            encoding="utf-8")
        forged = write_genai_model(Path(tmp) / "forged-boilerplate", ForgeSpec())
        rows += run_model(builtin.name, builtin, None)
        rows += run_model(f"{builtin.name} + preset", builtin, presets)
        rows += run_model("forged (builder boilerplate)", forged, None)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    print(f"# bare requests ({PROMPT!r}; no sampling field), {when}, "
          f"{platform.machine()}, python -m bench.sampling_defaults\n")
    _print(rows)
    print("\n/infill on a model without FIM tokens: top-k, top-p and min-p go to its "
          "line-start sampler (engine.generation.fim_sampler), so the engine's own options show "
          "0 / 1 / 0 there.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
