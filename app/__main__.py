"""``python -m app``: the desktop app. ``--selftest`` checks an install headless;
``--worker ARGS`` (used by the frozen app) runs the engine's command line instead."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-local-llm",
        description="ONNX Local LLM: chat and code completion with a language model that runs "
        "on this computer. Without options it opens the window and starts the local worker "
        "with the last model loaded (the built-in one the first time).",
        epilog="--worker ARGS (the first option) runs the engine's command line instead, as "
        "'python -m engine ARGS' does: the packaged app starts its worker this way.")
    parser.add_argument("--model", metavar="FOLDER",
                        help="model folder to load at start (default: the last one, else the "
                        "built-in model)")
    parser.add_argument("--remote", metavar="URL",
                        help="use this OpenAI-compatible server instead of a local worker "
                        "(with --selftest: check the chat and code completion through it)")
    parser.add_argument("--no-welcome", action="store_true", help="skip the first-run welcome")
    parser.add_argument("--selftest", action="store_true",
                        help="start the worker, load the model, answer a chat and a code "
                        "completion, print a JSON report, exit (0: all good)")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=120.0,
                        help="with --selftest: seconds allowed in all (default 120)")
    return parser


def _run_worker(args: list[str]) -> int:
    """``python -m engine ARGS`` in this process, through the engine's public command line."""
    import runpy

    sys.argv = [sys.argv[0], *args]
    try:
        runpy.run_module("engine", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if isinstance(done.code, int) or done.code is None:
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    return 0


#: What ``python -m app`` says where Qt is not installed (the base install: the engine and
#: its worker only).
NO_QT = ("The desktop app needs Qt (PySide6), which this install does not have: the base "
         "install is the engine and its worker. Install the app extra:\n"
         "    pip install 'onnx-local-llm[cpu,app]'\n"
         "(the worker alone runs without it: python -m engine serve)")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--worker"]:  # the frozen app starting its own worker
        return _run_worker(args_list[1:])
    args = _parser().parse_args(args_list)
    if importlib.util.find_spec("PySide6") is None:
        print(NO_QT, file=sys.stderr)
        return 1
    if args.selftest and args.remote:  # the chat and the completion through that server
        from app.remote_check import run_remote_selftest

        return run_remote_selftest(args.remote, None, args.timeout)
    if args.selftest:
        from app.selftest import run_selftest

        return run_selftest(args.model, args.timeout)
    from app.qt_libraries import display_problem

    problem = display_problem()  # Qt itself would abort naming the wrong library
    if problem:
        print(problem, file=sys.stderr)
        return 1
    from app.launch import run_gui

    return run_gui(args)


if __name__ == "__main__":
    sys.exit(main())
