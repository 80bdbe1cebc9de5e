"""The `serve` command's options (kept light: no web framework is imported here)."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.config import KV_DTYPES, PROVIDERS, SPIN_US
from engine.server.config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE, DEFAULT_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("models")
    source.add_argument("--model", type=Path, help="model folder to load at start")
    source.add_argument("--models-dir", type=Path, action="append", default=[],
                        help="folder of model folders the API may list and load (repeatable)")
    source.add_argument("--presets", type=Path, metavar="FILE",
                        help="the user's sampling presets per model (default: presets.json "
                             "in the user config folder); a request's left-out sampling "
                             "fields take them before the model's generation_config.json")
    source.add_argument("--no-default-model", action="store_true",
                        help="start with no model when neither --model nor --models-dir is "
                        "given (default: the small built-in model, when installed)")
    net = parser.add_argument_group("network and security")
    net.add_argument("--host", default="127.0.0.1",
                     help="address to bind (default 127.0.0.1; others are reachable from the "
                     "network)")
    net.add_argument("--port", type=int, default=DEFAULT_PORT,
                     help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    net.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every route but "
                     "/health (visible to local users in the process list: prefer "
                     "--api-key-file or $ONNX_LOCAL_LLM_API_KEY)")
    net.add_argument("--api-key-file", type=Path,
                     help="file (mode 0600) whose first line is the API key")
    net.add_argument("--admin-token-file", type=Path,
                     help="file holding the admin token (created with mode 0600 if missing; "
                     "default: in the user config folder)")
    net.add_argument("--cors-origin", action="append", default=[],
                     help="browser origin allowed to call the worker (repeatable)")
    net.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    net.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                     help="requests allowed to wait for the engine before 429")
    net.add_argument("--parent-pid", type=int,
                     help="stop (gracefully) when this process ends: the app passes its own "
                     "pid so a worker never outlives it")
    net.add_argument("--graceful-shutdown", type=float, default=5.0,
                     help="seconds in-flight requests get on SIGINT/SIGTERM")
    net.add_argument("--access-log", action="store_true",
                     help="log every request to stderr (the log file always has them)")
    net.add_argument("--log-file", type=Path,
                     help="the worker's rotating log file (default: worker.log in the user "
                     "log folder)")
    net.add_argument("--no-log-file", action="store_true",
                     help="log to stderr only")
    net.add_argument("--session-idle-timeout", type=float, default=1800.0,
                     help="seconds an X-Session-Id chat session is kept without a turn")
    net.add_argument("--max-sessions", type=int, default=64,
                     help="X-Session-Id chat sessions kept at most")
    net.add_argument("--read-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="seconds a request gets to arrive whole, headers and body; a slower "
                     "one is answered 408 and its connection closed (answers, streamed or not, "
                     "are not limited)")
    eng = parser.add_argument_group("engine")
    eng.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")
    eng.add_argument("--spin-us", type=int, default=SPIN_US, metavar="US",
                     help="how long idle ONNX Runtime threads spin before they sleep "
                          f"(default {SPIN_US}: between the operators of a step, not "
                          "after it; 0 never spins, which can be faster while other programs "
                          "keep every core busy)")
    eng.add_argument("--provider", choices=PROVIDERS, default="auto")
    eng.add_argument("--kv-max-len", type=int, help="cap on KV buffer length (tokens)")
    eng.add_argument("--vram-limit", default="auto",
                     help="GPU memory limit: auto, 0.5, 50%%, 8GiB, 512MiB ...")
    eng.add_argument("--host-ram-limit", default="auto",
                     help="RAM limit for this process: auto, 0.5, 50%%, 8GiB ...")
    eng.add_argument("--cache-reuse", type=int, default=256, metavar="N",
                     help="reuse runs of at least N cached tokens (or an eighth of a prompt "
                          "under 8N tokens, at least 64) found at other positions of a new "
                          "prompt by shifting their KV (0 = off: recompute them)")
    add_kv_dtype(eng)
    add_context_shift(eng)
    add_fixed_threads(eng)
    eng.add_argument("--kv-store-dir", type=Path,
                     help="where prompt KV is kept across restarts (default: the user cache)")
    eng.add_argument("--no-kv-store", action="store_true",
                     help="keep no prompt KV across requests on disk")


def add_context_shift(parser: argparse._ActionsContainer) -> None:
    """`--context-shift N`, for `generate` and `serve` (EngineConfig.context_shift)."""
    parser.add_argument("--context-shift", type=int, default=0, metavar="N",
                        help="when a sequence fills the context, keep its first N tokens and "
                             "drop the oldest after them (an eighth of the context at a time, "
                             "kept keys re-rotated) instead of ending the answer "
                             "(default 0: off)")


def add_fixed_threads(parser: argparse._ActionsContainer) -> None:
    """`--fixed-threads`, for `generate` and `serve` (EngineConfig.adaptive_threads)."""
    parser.add_argument("--fixed-threads", action="store_true",
                        help="keep every thread on the engine's kernels even while other "
                             "programs keep cores busy (default: fewer threads then, so no "
                             "step waits on a thread the OS has set aside)")


def add_kv_dtype(parser: argparse._ActionsContainer) -> None:
    """`--kv-dtype`, for `generate` and `serve` (EngineConfig.kv_dtype)."""
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default="auto",
                        help="the live KV cache's element type on the CPU: auto = 16 bits "
                             "where the engine's kernel runs attention (half the memory per "
                             "token: int16 whole numbers where the CPU has AVX-512 VNNI or "
                             "AVX-VNNI, "
                             "float16 elsewhere), else the model's own; int8 a quarter of "
                             "float32's memory (a scale per token and head); float32 keeps "
                             "a float32 export's (default auto)")
