"""``python -m app``: the desktop app. ``--selftest`` checks an install headless;
``--worker ARGS`` (used by the frozen app) runs the engine's command line instead."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx-local-llm", description=__doc__)
    parser.add_argument("--model", help="model folder to load at start (default: the last "
                        "one, else the built-in model)")
    parser.add_argument("--remote", help="use this OpenAI-compatible server instead of a "
                        "local worker")
    parser.add_argument("--no-welcome", action="store_true", help="skip the first-run welcome")
    parser.add_argument("--selftest", action="store_true",
                        help="start the worker, load the model, answer a chat and a code "
                        "completion, print a JSON report, exit (0: all good)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="--selftest: seconds allowed in all")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--worker"]:  # the frozen app starting its own worker
        from engine.__main__ import main as engine_main

        return engine_main(args_list[1:])
    args = _parser().parse_args(args_list)
    if args.selftest:
        from app.selftest import run_selftest

        return run_selftest(args.model, args.timeout)
    from app.launch import run_gui

    return run_gui(args)


if __name__ == "__main__":
    sys.exit(main())
