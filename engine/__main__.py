"""Command line: `python -m engine generate | inspect | serve`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from engine.config import PROVIDERS, EngineConfig, GenerateOptions
from engine.errors import EngineError, InvalidOptionError


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine",
                                     description="Run ONNX language models locally.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("--model", required=True, help="model folder")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text (special tokens are parsed)")
    src.add_argument("--chat", help="a user message, formatted with the chat template")
    src.add_argument("--token-ids", help="comma-separated prompt token ids")
    gen.add_argument("--system", help="system prompt for --chat")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--max-context", type=int)
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="0 = greedy (the default here)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--frequency-penalty", type=float, default=0.0)
    gen.add_argument("--presence-penalty", type=float, default=0.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="stop text (repeatable)")
    gen.add_argument("--no-stop-on-eos", action="store_true")
    gen.add_argument("--top-logprobs", type=int)
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--threads", type=int)
    gen.add_argument("--provider", choices=PROVIDERS, default="auto")
    gen.add_argument("--speculative", choices=("none", "prompt_lookup", "draft_model", "mtp"),
                     default="none", help="greedy only: guess tokens, verify them in one pass")
    gen.add_argument("--draft-model", help="draft model folder for --speculative draft_model")
    gen.add_argument("--truncate-prompt", action="store_true",
                     help="drop the oldest prompt tokens when the prompt does not fit")
    gen.add_argument("--vram-limit", default="auto",
                     help="GPU memory limit: auto, 0.5, 50%%, 8GiB, 512MiB ...")
    gen.add_argument("--host-ram-limit", default="auto",
                     help="RAM limit for this process: auto, 0.5, 50%%, 8GiB ...")

    ins = sub.add_parser("inspect", help="report what a model folder holds")
    ins.add_argument("model", help="model folder")
    ins.add_argument("--json", action="store_true")

    from engine.server.cli import add_arguments

    srv = sub.add_parser("serve", help="run the local worker (OpenAI, llama.cpp and Ollama "
                         "routes on 127.0.0.1)")
    add_arguments(srv)
    return parser


def _token_ids(raw: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(t) for t in raw.split(",") if t.strip())
    except ValueError as exc:
        raise InvalidOptionError("--token-ids", f"expected integers like 1,2,3, got {raw!r}",
                                 hint="separate token ids with commas") from exc
    return ids


def _generate(args: argparse.Namespace) -> int:
    from engine.engine import Engine, GenerateRequest
    from engine.tokenizer import ChatMessage

    options = GenerateOptions(
        max_new_tokens=args.max_new_tokens, max_context=args.max_context,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty, seed=args.seed,
        stop_sequences=tuple(args.stop), stop_on_eos=not args.no_stop_on_eos,
        top_logprobs=args.top_logprobs, speculative_mode=args.speculative,
        truncate_prompt=args.truncate_prompt)
    if args.chat is not None:
        messages = [ChatMessage("system", args.system)] if args.system else []
        messages.append(ChatMessage("user", args.chat))
        request = GenerateRequest(messages=tuple(messages), options=options)
    elif args.token_ids is not None:
        request = GenerateRequest(token_ids=_token_ids(args.token_ids), options=options)
    else:
        request = GenerateRequest(prompt=args.prompt, options=options)
    engine = Engine.load(args.model, EngineConfig(
        provider=args.provider, intra_op_threads=args.threads, vram_limit=args.vram_limit,
        host_ram_limit=args.host_ram_limit, draft_model=args.draft_model))
    result = None
    for event in engine.stream(request):
        if args.stream and event.text and not args.json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        result = event.result or result
    assert result is not None
    if args.json:
        print(json.dumps({
            "text": result.text, "token_ids": list(result.token_ids),
            "finish_reason": str(result.finish_reason), "prompt_tokens": result.prompt_tokens,
            "timings": result.timings.as_dict(), "provider": engine.provider,
            "decode_path": engine.decode_path,
            "resources": engine.resource_snapshot().as_dict(),
            "speculation": result.speculation.as_dict() if result.speculation else None,
            "prompt_tokens_dropped": result.prompt_tokens_dropped,
        }))
    elif args.stream:
        sys.stdout.write("\n")
    else:
        print(result.text)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from engine.describe import inspect_model

    report = inspect_model(args.model)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from engine.server.serve import run

    if args.access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    args = _build_parser().parse_args(argv)
    commands = {"generate": _generate, "inspect": _inspect, "serve": _serve}
    try:
        return commands[args.command](args)
    except EngineError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"fix: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
