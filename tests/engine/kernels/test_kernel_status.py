"""Whether the engine's own decode-attention kernel is in use, and why not, where a user or a
bug report looks: `engine.kernels.status()`, `python -m engine.kernels`, the load's log line
and `Engine.describe()` (the worker, `/props`, `inspect` and the app have tests of their own).
"""

from __future__ import annotations

import _ctypes
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from onnx import TensorProto

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest, kernels
from engine.model.graph_passes import own_attention_moves
from tests.engine.kernels.test_engine_kernels import _gqa_graph

built = pytest.mark.skipif(kernels.library() is None,
                           reason="the engine's kernels were not built (no C compiler)")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.kernels", *args], text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=120)


@built
def test_a_built_kernel_says_which_code_it_runs(monkeypatch):
    found = kernels.status()
    assert found.ready and found.state in ("avx2+fma", "portable")
    assert found.library == str(kernels.library()) and found.fix is None
    monkeypatch.setenv(kernels.ENV, "portable")
    forced = kernels.status()
    assert forced.state == "portable" and forced.reason == "ONNX_GENAI_KERNELS=portable"
    assert forced.line() == ("the engine kernels are ready (portable C, no "
                             "AVX2): ONNX_GENAI_KERNELS=portable")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags")
            for flag in line.partition(":")[2].split()}


@built
def test_an_int8_cache_says_when_its_scores_run_on_amx_tiles(monkeypatch):
    """Where the CPU (and Linux) has AMX-BF16 the int8 cache's scores run on the tile unit,
    and the status says so; ONNX_GENAI_KERNELS=avx512 leaves AMX out."""
    flags = _cpu_flags()
    found = kernels.status()
    amx = sys.platform == "linux" and {"amx_bf16", "avx512_bf16", "avx512bw"} <= flags
    assert ("AMX-BF16 for int8 and float16 KV" in (found.reason or "")) == amx, found.line()
    monkeypatch.setenv(kernels.ENV, "avx512")
    plain = kernels.status()
    assert "AMX" not in (plain.reason or "").replace("AMX left out", "")
    if "avx512f" in flags and sys.platform == "linux":
        assert plain.reason == "and AVX-512 (AMX left out: ONNX_GENAI_KERNELS=avx512)"


@built
def test_an_int16_cache_runs_on_vnni_where_the_cpu_has_it(monkeypatch):
    """An int16 cache's attention runs on VPDPWSSD where the CPU has it: AVX-512 VNNI, or
    AVX-VNNI on 256-bit registers (also with AVX-512 left out); plain C elsewhere and when
    told "portable". The engine keeps int16 KV by default where it runs on VNNI and no AMX
    tiles run the float16 cache's scores."""
    flags = _cpu_flags()
    wide = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma"} <= flags
    narrow = {"avx_vnni", "avx2", "fma"} <= flags
    amx = sys.platform == "linux" and {"amx_bf16", "avx512_bf16", "avx512bw"} <= flags
    if os.environ.get(kernels.ENV) not in ("portable", "avx2", "avx512"):
        assert kernels.i16kv_fast() == (wide or narrow)
        assert kernels.i16kv_preferred() == ((wide or narrow) and not amx)
    monkeypatch.setenv(kernels.ENV, "portable")
    assert not kernels.i16kv_fast() and not kernels.i16kv_preferred()
    monkeypatch.setenv(kernels.ENV, "avx2")  # AVX-512 and AMX left out
    assert kernels.i16kv_fast() == kernels.i16kv_preferred() == narrow
    monkeypatch.setenv(kernels.ENV, "avx512")  # AMX left out
    assert kernels.i16kv_fast() == kernels.i16kv_preferred() == (wide or narrow)


def test_not_built_says_why_and_how_to_fix_with_and_without_a_compiler(monkeypatch, tmp_path):
    missing = tmp_path / "decode_attention.ortops"
    monkeypatch.setenv(kernels.LIBRARY_ENV, str(missing))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    bare = kernels.status()
    assert not bare.ready and bare.state == "not built" and bare.compiler is None
    assert f"no decode_attention.ortops in {tmp_path}" in (bare.reason or "")
    assert "no C compiler on PATH" in (bare.reason or "")
    assert bare.fix is not None and "sudo apt-get install gcc" in bare.fix
    assert "./scripts/setup" in bare.fix
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "cc").write_text("#!/bin/sh\n", encoding="utf-8")
    (tools / "cc").chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    with_cc = kernels.status()
    assert with_cc.state == "not built" and with_cc.compiler == str(tools / "cc")
    assert f"a C compiler is on PATH now: {tools / 'cc'}" in with_cc.line()
    assert "pip install -v" in with_cc.line()


def test_turned_off_by_the_variable(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "0")
    off = kernels.status()
    assert off.state == "off" and not off.ready
    assert off.line() == ("the engine kernels are turned off: "
                          "ONNX_GENAI_KERNELS=0 in the environment; unset ONNX_GENAI_KERNELS "
                          "to turn it on")


def test_a_library_that_does_not_load_or_predates_the_report(monkeypatch, tmp_path):
    broken = tmp_path / "decode_attention.ortops"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setenv(kernels.LIBRARY_ENV, str(broken))
    assert kernels.status().state == "cannot load" and not kernels.status().ready
    # a shared library without EngineKernelsPaths, as built before it was added: it loads
    monkeypatch.setenv(kernels.LIBRARY_ENV, _ctypes.__file__)
    old = kernels.status()
    assert old.state == "built" and old.ready and "re-run the install" in (old.fix or "")


def test_the_command_prints_the_status_and_exits_1_when_not_ready(tmp_path):
    missing = str(tmp_path / "decode_attention.ortops")
    not_built = _cli(env={kernels.LIBRARY_ENV: missing})
    assert not_built.returncode == 1, not_built.stderr
    assert not_built.stdout.startswith("the engine kernels are not built: "
                                       f"no decode_attention.ortops in {tmp_path}")
    off = _cli("--json", env={kernels.ENV: "0"})
    report = json.loads(off.stdout)
    assert off.returncode == 1 and report["state"] == "off" and report["ready"] is False
    assert set(report) >= {"library", "reason", "compiler", "fix", "line"}


@built
def test_the_command_says_ready_when_built():
    ready = _cli()
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.startswith("the engine kernels are ready (")


@pytest.mark.parametrize(("graph", "why"), [
    (lambda: _gqa_graph(attrs={"qk_output": 1}), "attribute qk_output not handled"),
    (lambda: _gqa_graph(kv_type=TensorProto.FLOAT16), "fp16 KV cache"),
    (lambda: _gqa_graph(extra_input=True), "inputs or outputs not handled"),
    (lambda: _gqa_graph(domain="other.domain"), "operator of domain other.domain"),
])
def test_the_pass_says_why_a_node_keeps_onnx_runtimes_kernel(graph, why):
    moved, nodes, kept = own_attention_moves(graph())
    assert moved is None and nodes == 1
    assert len(kept) == 1 and next(iter(kept)).startswith(why) and sum(kept.values()) == 1


def _use(engine: Engine) -> dict:
    use = engine.describe()["engine_kernels"]
    assert isinstance(use, dict)
    return use


@built
def test_describe_counts_the_nodes_that_run_the_kernel(genai_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="engine.runtime.providers"):
        engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    use = _use(engine)
    assert use["ready"] and use["attention_nodes"] == 2 and use["moved"] == 2
    assert use["kept"] == {} and use["summary"] == \
        "2 of 2 GroupQueryAttention nodes run the engine kernel"
    assert any(r.levelno == logging.INFO and use["summary"] in r.getMessage()
               for r in caplog.records)


def test_a_load_without_the_library_warns_and_describe_says_why(genai_model_dir, tmp_path,
                                                                 monkeypatch, caplog):
    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "decode_attention.ortops"))
    with caplog.at_level(logging.INFO, logger="engine.runtime.providers"):
        engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    use = _use(engine)
    assert use["state"] == "not built" and use["moved"] == 0 and use["attention_nodes"] == 2
    assert use["kept"] == {"the kernel is not built": 2}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("0 of 2 GroupQueryAttention nodes run the engine kernel" in m
               and "is not built" in m for m in warned), warned
    answer = engine.generate(GenerateRequest(token_ids=(5, 6), options=GenerateOptions(
        max_new_tokens=2, stop_on_eos=False)))  # ONNX Runtime's kernel runs
    assert len(answer.token_ids) == 2


@pytest.mark.parametrize(("how", "why"), [
    ("config", "turned off by own_kernels=False"),
    ("variable", "turned off by ONNX_GENAI_KERNELS=0"),
])
def test_turned_off_a_load_says_so(genai_model_dir, monkeypatch, how, why):
    if how == "variable":
        monkeypatch.setenv(kernels.ENV, "0")
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1,
                                                       own_kernels=how != "config"))
    use = _use(engine)
    assert use["moved"] == 0 and use["kept"] == {why: 2}
    assert use["summary"].endswith(f"ONNX Runtime runs the other 2: {why}")


def test_a_graph_without_group_query_attention_says_so(optimum_model_dir):
    use = _use(Engine.load(optimum_model_dir, EngineConfig(intra_op_threads=1)))
    assert use["attention_nodes"] == 0 and use["moved"] == 0
    assert use["summary"] == \
        "no GroupQueryAttention in the graph: the engine kernel has nothing to run"


def test_the_library_path_variable_is_where_the_engine_looks(monkeypatch, tmp_path):
    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "x.ortops"))
    assert kernels.library() is None
    (tmp_path / "x.ortops").write_bytes(b"")
    assert kernels.library() == Path(tmp_path / "x.ortops")


def test_on_a_gpu_provider_the_nodes_keep_onnx_runtimes_kernel(genai_model_dir, monkeypatch):
    """The kernel is for the CPU: a model placed on CUDA says so (the decision only; a GPU
    machine runs the rest in tests/engine/runtime/test_gpu.py)."""
    from engine.model.io_spec import resolve_io
    from engine.model.model_dir import load_model_dir
    from engine.runtime import providers

    monkeypatch.setattr(providers, "available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    model = load_model_dir(genai_model_dir)
    spec = resolve_io(model.graph.inputs, model.graph.outputs, model.declared,
                      has_gqa=model.graph.has_gqa, source=model.format)
    graph, _, use = providers.pruned_graph(model.model_file, spec, EngineConfig(), "cuda", 2)
    assert graph is None and use.moved == 0
    assert dict(use.kept) == {"runs on cuda, the kernel is for the CPU": 2}


def test_the_wider_paths_a_cpu_adds_read_as_one_list_in_the_status_line():
    """`python -m engine.kernels` and the About dialog: "(AVX2+FMA and AVX-512, ...)"
    rather than "(AVX2+FMA): and AVX-512"."""
    def line(reason: str | None) -> str:
        return kernels.KernelStatus("avx2+fma", "/lib", reason, None, None).line()

    assert line("and AVX-512") == "the engine kernels are ready (AVX2+FMA and AVX-512)"
    assert line("and AVX-512, AMX-BF16 for int8 and float16 KV") == (
        "the engine kernels are ready (AVX2+FMA and AVX-512, AMX-BF16 for int8 and float16 KV)")
    assert line("and AVX-512 (AMX left out: ONNX_GENAI_KERNELS=avx512)") == (
        "the engine kernels are ready (AVX2+FMA and AVX-512; AMX left out: "
        "ONNX_GENAI_KERNELS=avx512)")
    assert line("AVX-512 left out (ONNX_GENAI_KERNELS=avx2)") == (
        "the engine kernels are ready (AVX2+FMA): AVX-512 left out (ONNX_GENAI_KERNELS=avx2)")
    assert line(None) == "the engine kernels are ready (AVX2+FMA)"
