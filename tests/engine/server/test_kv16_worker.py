"""The worker says which KV it keeps (float16 where the engine's kernel runs attention on
the CPU) and counts the memory slider's tokens with those bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine import kernels

F16 = kernels.library() is not None and kernels.f16kv_ready()


def test_resources_and_props_give_the_kv_dtype_and_its_bytes_per_token(server, engine):
    with server.client() as http:
        body = http.get("/v1/resources").json()
        props = http.get("/props").json()
    kv = body["kv"]
    assert kv["dtype"] == ("float16" if F16 else "float32") == engine.spec.kv_pairs[0].dtype
    assert kv["bytes_per_token"] == engine.spec.kv_bytes_per_token
    # the slider's tokens (the governor's budget) count pages of that size
    assert kv["page_bytes"] == kv["page_tokens"] * kv["bytes_per_token"]
    budget = body["governor"]["budget"]
    assert budget["page_bytes"] == kv["page_bytes"]
    assert budget["kv_tokens"] == budget["kv_bytes"] // kv["page_bytes"] * kv["page_tokens"]
    assert props["engine_kernels"]["kv_dtype"] == kv["dtype"]


def test_kv_dtype_float32_is_said_at_start(model_dir: Path, tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", "0",
                             "--threads", "1", "--model", str(model_dir), "--kv-dtype",
                             "float32", "--admin-token-file", str(tmp_path / "token"),
                             "--no-log-file", "--no-kv-store"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    assert proc.stdout is not None
    assert proc.stdout.readline()  # the ready line
    proc.terminate()
    _, stderr = proc.communicate(timeout=60)
    assert "kv: KV cache float32 (kv_dtype float32 asked for), " in stderr


def test_a_kv_dtype_the_engine_does_not_know_is_refused(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "engine", "generate", "--model",
                           str(tmp_path), "--prompt", "x", "--kv-dtype", "bf16"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--kv-dtype: invalid choice: 'bf16'" in proc.stderr
