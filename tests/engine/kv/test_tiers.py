"""The tiered KV store in the engine: reuse across processes is token-identical."""

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.config import KVStoreConfig

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [(11 * i + 5) % 450 + 9 for i in range(50)]

_CHILD = textwrap.dedent("""
    import json, sys
    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
    from engine.config import KVStoreConfig
    folder, store, quantize = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    config = EngineConfig(intra_op_threads=1, kv_store=KVStoreConfig(
        chunk_tokens=16, disk_dir=store, quantize=quantize))
    engine = Engine.load(folder, config)
    prompt = json.loads(sys.argv[4])
    result = engine.generate(GenerateRequest(token_ids=tuple(prompt), options=GenerateOptions(
        temperature=0.0, stop_on_eos=False, max_new_tokens=12)))
    stats = engine.kv_tiers.store.stats()
    engine.close()
    print(json.dumps({"tokens": list(result.token_ids), "hit": result.prefix_cache_hit_len,
                      "disk_hits": stats["disk_hits"], "corrupt": stats["corrupt_dropped"]}))
""")


def _child(folder: Path, store: Path, prompt: list[int], quantize: bool = False) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), str(store), "1" if quantize else "0",
         json.dumps(prompt)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cold(folder: Path, prompt: list[int]) -> list[int]:
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False))
    return list(engine.generate(GenerateRequest(token_ids=tuple(prompt), options=GenerateOptions(
        temperature=0.0, stop_on_eos=False, max_new_tokens=12))).token_ids)


@pytest.mark.parametrize("layout", ["genai", "optimum", "static"])
def test_restart_fetches_chunks_from_disk_and_output_is_identical(
        layout, genai_model_dir, optimum_model_dir, static_model_dir, tmp_path):
    folder = {"genai": genai_model_dir, "optimum": optimum_model_dir,
              "static": static_model_dir}[layout]
    store = tmp_path / "kv"
    first = _child(folder, store, PROMPT)
    assert first["hit"] == 0
    second = _child(folder, store, PROMPT)  # a new process: only the disk tier remains
    assert second["hit"] == 48 and second["disk_hits"] == 3
    assert first["tokens"] == second["tokens"] == _cold(folder, PROMPT)


def test_corrupt_chunk_is_dropped_and_recomputed(genai_model_dir, tmp_path):
    store = tmp_path / "kv"
    first = _child(genai_model_dir, store, PROMPT)
    files = sorted(store.rglob("*.kvc"))
    assert len(files) >= 3
    for path in files:  # flip one byte in every chunk's payload
        data = bytearray(path.read_bytes())
        data[-7] ^= 0x40
        path.write_bytes(bytes(data))
    second = _child(genai_model_dir, store, PROMPT)
    assert second["hit"] == 0 and second["corrupt"] >= 1
    assert second["tokens"] == first["tokens"]


def test_int8_chunks_serve_a_restart(genai_model_dir, tmp_path):
    store = tmp_path / "kv8"
    _child(genai_model_dir, store, PROMPT, quantize=True)
    second = _child(genai_model_dir, store, PROMPT, quantize=True)
    assert second["hit"] == 48
    # lossy in general; on this model and prompt the greedy tokens stay identical
    agree = sum(a == b for a, b in zip(second["tokens"], _cold(genai_model_dir, PROMPT),
                                       strict=True))
    assert agree == 12


def test_unusable_cache_dir_warns_once_and_generation_is_unaffected(
        genai_model_dir, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    config = EngineConfig(intra_op_threads=1, kv_store=KVStoreConfig(
        chunk_tokens=16, disk_dir=str(blocker / "kv")))
    with caplog.at_level(logging.WARNING):
        engine = Engine.load(genai_model_dir, config)
        results = [engine.generate(GenerateRequest(token_ids=tuple(PROMPT),
                                                    options=GenerateOptions(
            temperature=0.0, stop_on_eos=False, max_new_tokens=12))) for _ in range(2)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "disk" in r.getMessage().lower()]
    assert len(warnings) == 1
    assert list(results[0].token_ids) == _cold(genai_model_dir, PROMPT)
    assert results[1].token_ids == results[0].token_ids


def test_each_kv_row_format_has_its_own_store_identity(genai_model_dir):
    """Chunks kept on disk by one KV format are never read as another's: float16, float32
    and the int8 rows (whose scale shrank from 4 bytes to 2) each get their own identity."""
    from engine.kv.tiers import model_identity
    from engine.model.kv16_pass import I8_SCALE_BYTES
    from engine.model.model_dir import load_model_dir

    model = load_model_dir(genai_model_dir)
    ids = {d: model_identity(model, "cpu", d) for d in ("float32", "float16", "int8")}
    assert len(set(ids.values())) == 3
    assert f":int8+{I8_SCALE_BYTES}:" in ids["int8"] and ":int8:" not in ids["int8"]
