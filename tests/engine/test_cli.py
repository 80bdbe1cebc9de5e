"""The command line as a user runs it: a real subprocess on a forged model."""

import json
import subprocess
import sys


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


def test_errors_print_the_problem_and_the_fix_without_a_traceback(tmp_path, genai_model_dir):
    proc = _run("generate", "--model", str(tmp_path / "missing"), "--prompt", "x")
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad = _run("generate", "--model", str(genai_model_dir), "--prompt", "x", "--top-p", "0")
    assert bad.returncode == 2 and "top_p" in bad.stderr and "Traceback" not in bad.stderr
