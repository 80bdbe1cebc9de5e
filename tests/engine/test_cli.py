"""The command line as a user runs it: a real subprocess on a forged model."""

import argparse
import json
import os
import subprocess
import sys

from engine import kernels


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True,
                          text=True, timeout=120)


def test_generate_json_reports_text_tokens_and_timings(genai_model_dir):
    proc = _run("generate", "--model", str(genai_model_dir), "--prompt", "def fib(n):",
                "--max-new-tokens", "8", "--no-stop-on-eos", "--json", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["token_ids"]) == 8
    assert out["finish_reason"] == "max_tokens"
    assert out["prompt_tokens"] > 0
    assert set(out["timings"]) >= {"ttft_ms", "prefill_tok_s", "decode_tok_s"}
    assert out["provider"] == "cpu" and out["decode_path"] == "shared_buffer"


def test_generate_streams_text(genai_model_dir):
    proc = _run("generate", "--model", str(genai_model_dir), "--token-ids", "5,6,7",
                "--max-new-tokens", "6", "--no-stop-on-eos", "--stream")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_inspect_json(genai_model_dir):
    proc = _run("inspect", str(genai_model_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["decode_path"] == "shared_buffer" and report["format"] == "genai"
    kernels = report["engine_kernels"]  # what a load on the CPU would run for attention
    assert kernels["attention_nodes"] == 2 and kernels["moved"] == (2 * kernels["ready"])


def test_inspect_says_when_the_engines_kernel_is_not_built(genai_model_dir, tmp_path):
    env = {**os.environ, "ONNX_GENAI_KERNELS_LIBRARY": str(tmp_path / "absent.ortops")}
    proc = subprocess.run([sys.executable, "-m", "engine", "inspect", str(genai_model_dir)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "Attention (CPU): 0 of 2 GroupQueryAttention nodes run the engine kernel; ONNX " \
        "Runtime runs the other 2: the kernel is not built" in lines
    assert any(line.strip().startswith("the engine kernels are not built: "
                                       f"no absent.ortops in {tmp_path}") for line in lines)


def test_errors_print_the_problem_and_the_fix_without_a_traceback(tmp_path, genai_model_dir):
    proc = _run("generate", "--model", str(tmp_path / "missing"), "--prompt", "x")
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad = _run("generate", "--model", str(genai_model_dir), "--prompt", "x", "--top-p", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "error: --top-p: expected a number in (0.0, 1.0], got 0.0" in bad.stderr


def test_errors_name_the_flag_the_user_typed_not_the_internal_field(genai_model_dir, tmp_path):
    for command, flag, value in (("generate", "--threads", "0"), ("generate", "--stop", ""),
                                 ("serve", "--threads", "0"),
                                 ("serve", "--session-idle-timeout", "0")):
        args = ["--model", str(genai_model_dir), flag, value]
        if command == "generate":
            args += ["--prompt", "x"]
        else:
            args += ["--port", "0", "--admin-token-file", str(tmp_path / "token"),
                     "--no-kv-store"]
        proc = _run(command, *args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"error: {flag}: "), proc.stderr
        for field in ("intra_op_threads", "stop_sequences", "session_idle_s"):
            assert field not in proc.stderr


def test_every_generate_option_says_what_it_does_and_its_default():
    from engine.__main__ import _build_parser

    parser = _build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    generate = sub.choices["generate"]
    options = [a for a in generate._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 25
    # --model and the prompt are required (--chat and --token-ids stand in for --prompt)
    wants = {"model": "required", "prompt": "required", "chat": "instead of --prompt",
             "token_ids": "instead of --prompt"}
    for action in options:
        assert action.help, f"{action.option_strings[0]} has no help text"
        wanted = wants.get(action.dest, "default")
        assert wanted in action.help, f"{action.option_strings[0]}: {action.help!r}"
    shown = _run("generate", "--help").stdout
    assert "--max-new-tokens N    most tokens to generate (default 128)" in shown


def test_top_logprobs_are_in_the_json_output(genai_model_dir):
    proc = _run("generate", "--model", str(genai_model_dir), "--token-ids", "5,6,7",
                "--max-new-tokens", "3", "--no-stop-on-eos", "--json", "--top-logprobs", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [lp["token_id"] for lp in out["logprobs"]] == out["token_ids"]
    assert all(len(lp["top"]) == 2 and lp["logprob"] <= 0 for lp in out["logprobs"])


def test_inspect_prints_a_readable_summary(genai_model_dir):
    proc = _run("inspect", str(genai_model_dir))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"Model folder:    {genai_model_dir}"
    assert "Context:         256 tokens" in lines
    # float16 where the engine's kernel runs attention (engine.model.kv16_pass)
    half = kernels.library() is not None and kernels.f16kv_ready()
    assert ("KV cache:        2 layers x 2 heads of 16 float16: 256 bytes a token, 64.0 KiB "
            "for the whole context" if half else
            "KV cache:        2 layers x 2 heads of 16 float32: 512 bytes a token, 128.0 KiB "
            "for the whole context") in lines
    assert "Code infill:     qwen" in lines and "Chat template:   yes" in lines
    assert not any(ch in proc.stdout for ch in "{}[]'")  # no Python reprs
