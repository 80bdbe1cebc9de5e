"""Command line: `python -m engine generate | inspect | serve | import-gguf | catalog |
pull`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Collection, Sequence
from typing import Any

from engine.config import PROVIDERS, EngineConfig, GenerateOptions
from engine.errors import EngineError, InvalidOptionError


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine",
                                     description="Run ONNX language models locally.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         description="Generate text from a prompt, a chat message or token "
                         "ids, and print it.")
    gen.add_argument("--model", required=True, metavar="FOLDER",
                     help="model folder (an ONNX model with its tokenizer.json); required")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT",
                     help="raw prompt text, special tokens parsed (one of --prompt, --chat, "
                     "--token-ids is required)")
    src.add_argument("--chat", metavar="TEXT",
                     help="instead of --prompt: a user message, formatted with the model's "
                     "chat template")
    src.add_argument("--token-ids", metavar="IDS",
                     help="instead of --prompt: comma-separated prompt token ids, e.g. 1,2,3")
    gen.add_argument("--system", metavar="TEXT", help="system prompt for --chat (default: none)")
    gen.add_argument("--max-new-tokens", metavar="N", type=int, default=128,
                     help="most tokens to generate (default 128)")
    gen.add_argument("--max-context", metavar="N", type=int,
                     help="most tokens of prompt and answer together (default: the model's "
                     "context length)")
    gen.add_argument("--temperature", metavar="T", type=float, default=0.0,
                     help="0 always takes the likeliest token (greedy); higher values sample "
                     "more freely (default 0)")
    gen.add_argument("--top-k", metavar="K", type=int, default=0,
                     help="sample among the K likeliest tokens only; 0 = no limit (default 0)")
    gen.add_argument("--top-p", metavar="P", type=float, default=1.0,
                     help="sample among the likeliest tokens whose probabilities add up to P; "
                     "1 = no limit (default 1.0)")
    gen.add_argument("--min-p", metavar="P", type=float, default=0.0,
                     help="drop tokens less likely than P times the likeliest one; 0 = off "
                     "(default 0)")
    gen.add_argument("--repetition-penalty", metavar="X", type=float, default=1.0,
                     help="make tokens already in the prompt or answer less likely by this "
                     "factor; 1 = off (default 1.0)")
    gen.add_argument("--frequency-penalty", metavar="X", type=float, default=0.0,
                     help="lower a token's score by this much for every time it appeared in "
                     "the answer; 0 = off (default 0)")
    gen.add_argument("--presence-penalty", metavar="X", type=float, default=0.0,
                     help="lower the score of every token in the answer by this much; 0 = off "
                     "(default 0)")
    gen.add_argument("--seed", metavar="N", type=int,
                     help="random seed: the same seed gives the same sampled text (default: a "
                     "new seed each run)")
    gen.add_argument("--stop", metavar="TEXT", action="append", default=[],
                     help="stop when this text appears; repeatable (default: none)")
    gen.add_argument("--no-stop-on-eos", action="store_true",
                     help="go on past the model's end-of-text token (default: stop there)")
    gen.add_argument("--top-logprobs", metavar="N", type=int,
                     help="with --json, the N likeliest alternatives of every token, N <= 20 "
                     "(default: none)")
    gen.add_argument("--stream", action="store_true",
                     help="print text as it is generated (default: all of it at the end)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object with the text, token ids, timings and "
                     "resources (default: the text only)")
    gen.add_argument("--threads", metavar="N", type=int,
                     help="CPU threads ONNX Runtime uses (default: the physical cores)")
    gen.add_argument("--provider", choices=PROVIDERS, default="auto",
                     help="where the model runs; auto takes a GPU when there is one and the "
                     "model fits (default auto)")
    gen.add_argument("--speculative",
                     choices=("auto", "none", "prompt_lookup", "draft_model", "mtp"),
                     default="auto",
                     help="greedy only: guess tokens and verify them in one pass; the same "
                     "text, faster where the text repeats; auto: prompt lookup where the "
                     "engine's kernels keep the text exactly the same (docs/speculative.md) "
                     "(default auto)")
    from engine.server.cli import add_context_shift, add_fixed_threads, add_kv_dtype

    add_kv_dtype(gen)
    add_context_shift(gen)
    add_fixed_threads(gen)
    gen.add_argument("--draft-model", metavar="FOLDER",
                     help="draft model folder for --speculative draft_model (default: none)")
    gen.add_argument("--truncate-prompt", action="store_true",
                     help="drop the oldest prompt tokens when the prompt does not fit "
                     "(default: refuse it)")
    gen.add_argument("--vram-limit", metavar="LIMIT", default="auto",
                     help="GPU memory limit: auto, 0.5, 50%%, 8GiB, 512MiB ... (default auto)")
    gen.add_argument("--host-ram-limit", metavar="LIMIT", default="auto",
                     help="RAM limit for this process: auto, 0.5, 50%%, 8GiB ... "
                     "(default auto)")

    ins = sub.add_parser("inspect", help="report what a model folder holds")
    ins.add_argument("model", help="model folder")
    ins.add_argument("--json", action="store_true",
                     help="print the whole report as JSON (default: a readable summary)")

    imp = sub.add_parser("import-gguf", help="convert a GGUF file into a model folder",
                         description="Convert a GGUF model file (llama, mistral, qwen2, qwen3) "
                         "into an ONNX model folder this engine and onnxruntime-genai load. "
                         "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights are kept "
                         "bit for bit; other types are re-quantized (gguf_import.json in the "
                         "folder says which).")
    imp.add_argument("gguf", metavar="FILE.gguf", help="the GGUF file to convert")
    imp.add_argument("out_dir", metavar="OUT_DIR",
                     help="the model folder to write (must not exist yet, or be empty)")
    imp.add_argument("--precision", choices=("auto", "int4", "int8", "fp16", "fp32"),
                     default="auto",
                     help="weights: auto keeps the quantized types above and float tensors as "
                     "they are and re-quantizes others to int4; int4/int8 store every "
                     "projection in 4/8 bits; fp16/fp32 dequantize (default auto)")
    imp.add_argument("--compute", choices=("int8", "fp32"), default="int8",
                     help="how 4-bit projections multiply: int8 (activations quantized, as "
                     "the onnxruntime-genai builder's CPU exports and llama.cpp do; faster) "
                     "or fp32 (the GGUF's own arithmetic: closest to llama.cpp's results, "
                     "about 0.75x the decode speed) (default int8)")
    imp.add_argument("--quiet", action="store_true", help="no progress lines (default: print "
                     "them to stderr)")

    from engine.hub.cli import add_arguments as add_hub_commands

    add_hub_commands(sub)

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
    from engine.text.tokenizer import ChatMessage

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
        host_ram_limit=args.host_ram_limit, draft_model=args.draft_model,
        kv_dtype=args.kv_dtype, adaptive_threads=not args.fixed_threads,
        context_shift=args.context_shift))
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
            **({"logprobs": [{"token_id": lp.token_id, "logprob": lp.logprob,
                              "top": [list(pair) for pair in lp.top]}
                             for lp in result.logprobs]} if args.top_logprobs else {}),
        }))
    elif args.stream:
        sys.stdout.write("\n")
    else:
        print(result.text)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from engine.runtime.describe import inspect_model

    report = inspect_model(args.model)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(summary(report))
    return 0


def _import_gguf(args: argparse.Namespace) -> int:
    from engine.model.gguf import Progress, import_gguf

    def show(p: Progress) -> None:
        if not args.quiet:
            print(f"[{p.done}/{p.total}] {p.what}", file=sys.stderr, flush=True)

    result = import_gguf(args.gguf, args.out_dir, precision=args.precision,
                         compute=args.compute, progress=show)
    print(f"{result.out_dir}: {result.architecture}, {_size(result.bytes)}, "
          f"{result.lossless} weights kept bit for bit, {result.requantized} re-quantized or "
          f"rounded, {result.seconds:.1f} s")
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def summary(report: dict[str, Any]) -> str:
    """``inspect``'s report as a few lines a person reads (``--json`` has all of it)."""
    kv = report["kv"]
    external = report["external_data"]
    weights = _size(report["weights_bytes"])
    if external:
        weights += f" ({len(external)} external data file{'s' * (len(external) > 1)}: " \
                   f"{', '.join(external)})"
    safety = report["cuda_graph_safety"]
    eos = ", ".join(str(t) for t in report["eos_token_ids"]) or "none declared"
    lines = [
        f"Model folder:    {report['path']}",
        f"Format:          {report['format']} ({report['model_file']})",
        f"Weights:         {weights}, quantization {report['quantization']}",
        f"Context:         {report['context_length']} tokens",
        f"Vocabulary:      {report['vocab_size']} tokens; end of text: {eos}; "
        f"start: {report['bos_token_id'] if report['bos_token_id'] is not None else 'none'}",
        f"KV cache:        {kv['layers']} layers x {kv['kv_heads']} heads of {kv['head_dim']} "
        f"{kv['dtype']}: {_size(kv['bytes_per_token'])} a token, "
        f"{_size(kv['bytes_per_token'] * report['context_length'])} for the whole context",
        f"Decode path:     {report['decode_path']}",
        f"Chat template:   {'yes' if report['chat_template'] else 'no'}",
        f"Code infill:     {report['fim_family'] or 'no FIM tokens'}",
        "CUDA graphs:     " + ("can be captured" if safety["safe"]
                               else "declined: " + "; ".join(safety["reasons"])),
    ]
    kernels = report["engine_kernels"]
    lines.append(f"Attention (CPU): {kernels['summary']}")
    if kernels.get("kv_reason"):
        lines.append(f"                 {kernels['kv_summary']}")
    if not kernels["ready"] or kernels["reason"]:
        lines.append(f"                 {kernels['line']}")
    warnings = report["warnings"]
    lines.append("Warnings:        " + ("none" if not warnings else warnings[0]))
    lines += [f"                 {w}" for w in warnings[1:]]
    lines.append("(--json prints every field, the inputs and outputs of the graph included)")
    return "\n".join(lines)


def _serve(args: argparse.Namespace) -> int:
    from engine.server.serve import run

    return run(args)  # it sets up the worker's log (engine/server/worker_log.py)


def _flags_of(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """Every option string of ``command``'s sub-parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices[command]._option_string_actions)
    return set()


#: Option fields whose command-line flag is not ``--`` + the field with dashes.
_FLAGS = {
    "intra_op_threads": "--threads", "spin_duration_us": "--spin-us",
    "speculative_mode": "--speculative", "stop_sequences": "--stop",
    "session_idle_s": "--session-idle-timeout",
}


def _with_flag(exc: EngineError, flags: Collection[str]) -> str:
    """The error's message, naming the command-line flag (one of ``flags``) instead of the
    option's field: ``--threads``, not ``intra_op_threads``."""
    if not isinstance(exc, InvalidOptionError) or not exc.message.startswith(exc.field):
        return exc.message
    field = exc.field.split("[", 1)[0]
    flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
    if flag not in flags:
        return exc.message
    return flag + exc.message[len(exc.field):]


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    parser = _build_parser()
    args = parser.parse_args(argv)
    from engine.hub import cli as hub_cli

    commands = {"generate": _generate, "inspect": _inspect, "serve": _serve,
                "import-gguf": _import_gguf, "catalog": hub_cli.catalog,
                "pull": hub_cli.pull}
    try:
        return commands[args.command](args)
    except EngineError as exc:
        print(f"error: {_with_flag(exc, _flags_of(parser, args.command))}", file=sys.stderr)
        if exc.hint:
            print(f"fix: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
