"""``import-gguf``: small GGUF files made in code, converted, loaded by the Engine, and their
logits compared with a numpy forward pass read straight from the GGUF (llama.cpp's
conventions: tests/engine/model/gguf_reference.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType as QT

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import CancelledError, ModelLoadError, UnsupportedModelError
from engine.model.gguf import Progress, import_gguf
from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf
from tests.engine.model.gguf_reference import reference_logits
from tests.peers import onnxruntime_genai

IDS = [5, 100, 200, 17, 300, 42, 7, 8, 9, 400, 3, 250]

CASES = {
    "llama-Q4_0": TinySpec("llama", QT.Q4_0),
    "llama-Q4_1": TinySpec("llama", QT.Q4_1),
    "llama-Q8_0": TinySpec("llama", QT.Q8_0),
    "llama-Q5_0": TinySpec("llama", QT.Q5_0),
    "qwen2-Q5_1-untied": TinySpec("qwen2", QT.Q5_1, tied=False),
    "llama-F16": TinySpec("llama", QT.F16),
    "llama-F32-untied": TinySpec("llama", QT.F32, tied=False),
    "mistral-Q4_1-untied": TinySpec("mistral", QT.Q4_1, tied=False),
    "qwen2-Q4_0-bias": TinySpec("qwen2", QT.Q4_0),
    "qwen3-Q8_0-qknorm": TinySpec("qwen3", QT.Q8_0),
    # K-quants come in blocks of 256: every K of the model must be a multiple
    "llama-Q4_K": TinySpec("llama", QT.Q4_K, hidden=256, head_dim=64, ffn=256),
    "qwen2-Q5_K": TinySpec("qwen2", QT.Q5_K, hidden=256, head_dim=64, ffn=256),
    "qwen3-Q6_K": TinySpec("qwen3", QT.Q6_K, hidden=256, head_dim=64, ffn=256),
    "llama-Q4_K-untied": TinySpec("llama", QT.Q4_K, tied=False, hidden=256, head_dim=64,
                                  ffn=256),
    "llama-Q3_K": TinySpec("llama", QT.Q3_K, hidden=256, head_dim=64, ffn=256),
    "llama-Q6_K-untied": TinySpec("llama", QT.Q6_K, tied=False, hidden=256, head_dim=64,
                                  ffn=256),
}
LOSSLESS = {"Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "F16", "F32"}


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def tok_dir(gguf_dir: Path) -> Path:
    return tokenizer_source(gguf_dir)


def _gguf(gguf_dir: Path, tok_dir: Path, case: str) -> Path:
    path = gguf_dir / f"{case}.gguf"
    if not path.exists():
        write_gguf(path, CASES[case], tok_dir)
    return path


def _logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    # float32 KV, as the reference forward pass keeps it (float16 KV moves the logits by
    # its rounding, ~5e-4 of their largest: tests/engine/kernels/test_kv16.py)
    engine = Engine.load(model_dir, EngineConfig(kv_dtype="float32"))
    try:
        return engine.runner.forward(np.array(ids, np.int64), all_logits=True).copy()
    finally:
        engine.close()


def _exact_compute_copy(src: Path, dst: Path) -> Path:
    """The folder with every MatMulNBits computing in fp32 (accuracy_level 0) instead of on
    int8-quantized inputs: then only the stored weights can make it differ."""
    shutil.copytree(src, dst)
    model = onnx.load(str(dst / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = 0
    onnx.save(model, str(dst / "model.onnx"))
    return dst


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_import_matches_the_gguf_forward_pass(gguf_dir, tok_dir, tmp_path, case):
    gguf = _gguf(gguf_dir, tok_dir, case)
    out = import_gguf(gguf, tmp_path / "m", precision="fp32").out_dir
    ref = reference_logits(str(gguf), IDS)
    got = _logits(out, IDS)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() < 1e-4 * scale
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_import_keeps_or_requantizes_and_says_which(gguf_dir, tok_dir, tmp_path, case):
    spec = CASES[case]
    gguf = _gguf(gguf_dir, tok_dir, case)
    out = import_gguf(gguf, tmp_path / "m").out_dir
    meta = json.loads((out / "gguf_import.json").read_text())
    projections = {k: v for k, v in meta["tensors"].items() if k.startswith("blk.")}
    assert len(projections) == 7 * spec.layers
    lossless = spec.qtype.name in LOSSLESS
    assert all(t["lossless"] is lossless for t in projections.values())
    assert all(t["gguf_type"] == spec.qtype.name for t in projections.values())
    ref = reference_logits(str(gguf), IDS)
    scale = np.abs(ref).max()
    # as the engine runs it (MatMulNBits on int8-quantized inputs, like llama.cpp's CPU path)
    got = _logits(out, IDS)
    assert _correlation(got, ref) > 0.98
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.75
    # the weights themselves: exact where the GGUF's blocks were kept
    exact = _logits(_exact_compute_copy(out, tmp_path / "exact"), IDS)
    if lossless:
        assert np.abs(exact - ref).max() < 1e-4 * scale
    else:  # re-quantized: close, not equal
        assert np.abs(exact - ref).max() > 1e-4 * scale
        assert _correlation(exact, ref) > 0.98


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def test_q4_and_q8_blocks_become_matmulnbits_with_the_same_scales(gguf_dir, tok_dir, tmp_path):
    out = import_gguf(_gguf(gguf_dir, tok_dir, "llama-Q4_0"), tmp_path / "m").out_dir
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 1 + 2 * 5  # lm head + per layer qkv, o, gate, up, down
    assert "GatherBlockQuantized" in ops and ops.count("GroupQueryAttention") == 2
    assert all(n.op_type not in ("MatMul",) or "offsets" not in n.output[0]
               for n in model.graph.node)  # Q4_0 needs no offset term
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["type"] == "llama"
    assert config["model"]["decoder"]["head_size"] == 16


@pytest.mark.parametrize("precision,stored", [("int4", "int4"), ("int8", "int8"),
                                              ("fp16", "fp16"), ("fp32", "fp32")])
def test_precision_decides_how_weights_are_stored(gguf_dir, tok_dir, tmp_path, precision, stored):
    gguf = _gguf(gguf_dir, tok_dir, "llama-Q4_1")
    out = import_gguf(gguf, tmp_path / "m", precision=precision).out_dir
    meta = json.loads((out / "gguf_import.json").read_text())
    assert {t["stored"] for t in meta["tensors"].values()} == {stored}
    # Q4_1 blocks fit int4 and int8 without loss; fp16 rounds d * q + m
    assert all(t["lossless"] is (precision != "fp16") for t in meta["tensors"].values()
               if t["gguf_type"] == "Q4_1")
    ref = reference_logits(str(gguf), IDS)
    got = _logits(out, IDS)
    assert _correlation(got, ref) > 0.99


def test_tokenizer_is_rebuilt_from_the_gguf_vocabulary(gguf_dir, tok_dir, tmp_path):
    from tokenizers import Tokenizer

    out = import_gguf(_gguf(gguf_dir, tok_dir, "llama-Q8_0"), tmp_path / "m").out_dir
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    source = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    text = ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 12345\n"
            "<|im_start|>user\nÜber café 東京 'll 've<|im_end|>\n")
    assert ours.encode(text).ids == source.encode(text).ids
    assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and "chat_template" in config
    assert (out / "chat_template.jinja").read_text().startswith("{%- for message")


def test_engine_chats_with_the_imported_folder(gguf_dir, tok_dir, tmp_path):
    from engine.config import GenerateOptions
    from engine.engine import GenerateRequest
    from engine.text.tokenizer import ChatMessage

    out = import_gguf(_gguf(gguf_dir, tok_dir, "qwen2-Q4_0-bias"), tmp_path / "m").out_dir
    engine = Engine.load(out)
    try:
        request = GenerateRequest(messages=(ChatMessage("user", "hello"),),
                                  options=GenerateOptions(max_new_tokens=8))
        prompt = engine.encode_request(request)
        assert prompt[:1] == [engine.tokenizer.token_to_id("<|im_start|>")]
        result = engine.generate(request)
        assert len(result.token_ids) >= 1
    finally:
        engine.close()


@pytest.mark.parametrize("case", ["llama-Q8_0", "mistral-Q4_1-untied", "qwen2-Q4_0-bias",
                                  "qwen3-Q8_0-qknorm", "llama-Q6_K-untied"])
def test_onnxruntime_genai_loads_the_folder_and_agrees(gguf_dir, tok_dir, tmp_path, case):
    og = onnxruntime_genai()
    out = import_gguf(_gguf(gguf_dir, tok_dir, case), tmp_path / "m").out_dir
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(IDS) + 6, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(IDS)
    theirs = []
    while not generator.is_done():
        generator.generate_next_token()
        theirs.append(int(generator.get_next_tokens()[0]))
    engine = Engine.load(out)
    try:
        ours = []
        logits = engine.runner.forward(np.array(IDS, np.int64))
        for _ in range(len(theirs)):
            ours.append(int(np.argmax(logits)))
            logits = engine.runner.forward(np.array(ours[-1:], np.int64))
    finally:
        engine.close()
    assert ours == theirs


def test_progress_reports_every_layer_and_cancel_leaves_nothing(gguf_dir, tok_dir, tmp_path):
    gguf = _gguf(gguf_dir, tok_dir, "llama-Q4_0")
    seen: list[Progress] = []
    import_gguf(gguf, tmp_path / "m", progress=seen.append)
    assert [p.done for p in seen] == list(range(1, seen[0].total + 1))
    assert {"blk.0", "blk.1"} <= {p.what for p in seen}
    with pytest.raises(CancelledError):
        import_gguf(gguf, tmp_path / "cancelled", cancel=lambda: len(seen) > 6,
                    progress=seen.append)
    assert not any("cancelled" in p.name for p in tmp_path.iterdir())


def test_truncated_and_corrupt_files_get_a_clear_error(gguf_dir, tok_dir, tmp_path):
    data = _gguf(gguf_dir, tok_dir, "llama-Q4_0").read_bytes()
    for cut in (len(data) - 100, len(data) // 2, 200, 10):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="damaged or truncated|truncated") as err:
            import_gguf(bad, tmp_path / f"out{cut}")
        assert "download the file again" in str(err.value)
        assert not any(f"out{cut}" in p.name for p in tmp_path.iterdir())
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        import_gguf(not_gguf, tmp_path / "out")


def test_a_cut_download_is_refused_from_the_header_with_both_sizes(gguf_dir, tok_dir,
                                                                   tmp_path):
    """The header's tensor table gives the size the file must have: a file cut anywhere in
    its tensor data is refused with that size and the file's own, before any tensor is
    read (`python -m bench.gguf_truncated` measures how fast, on a large file)."""
    full = _gguf(gguf_dir, tok_dir, "qwen2-Q5_1-untied")
    data = full.read_bytes()
    for cut in (len(data) - 1, len(data) * 2 // 3):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError) as err:
            import_gguf(bad, tmp_path / f"out{cut}")
        message = str(err.value)
        assert f"need {len(data):,} bytes, the file has {cut:,}" in message, message
        assert "download the file again" in message
    # cut inside the header itself: said so, with the size it has
    bad = tmp_path / "cut-header.gguf"
    bad.write_bytes(data[:4000])
    with pytest.raises(ModelLoadError, match="ends at byte 4,000, inside its own header"):
        import_gguf(bad, tmp_path / "out-header")


def test_tensors_that_disagree_with_the_metadata_are_named(tok_dir, tmp_path):
    path = write_gguf(tmp_path / "g.gguf", TinySpec(), tok_dir, ffn_in_metadata=96)
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_gate\.weight has shape \[64, 128\]"
                       r".*says \[64, 96\]") as err:
        import_gguf(path, tmp_path / "out")
    assert "download the file again" in str(err.value)
    assert not any("out" in p.name for p in tmp_path.iterdir())


def test_unsupported_architecture_is_named(gguf_dir, tok_dir, tmp_path):
    path = write_gguf(tmp_path / "g.gguf", TinySpec(), tok_dir, arch_name="gemma2")
    with pytest.raises(UnsupportedModelError, match="'gemma2'.*llama, mistral, qwen2, qwen3"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_existing_folder_is_not_overwritten(gguf_dir, tok_dir, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("mine")
    with pytest.raises(ModelLoadError, match="already exists"):
        import_gguf(_gguf(gguf_dir, tok_dir, "llama-Q4_0"), tmp_path / "m")
    assert (tmp_path / "m" / "keep.txt").read_text() == "mine"


def test_cli_imports_and_reports(gguf_dir, tok_dir, tmp_path):
    gguf = _gguf(gguf_dir, tok_dir, "llama-Q8_0")
    done = subprocess.run([sys.executable, "-m", "engine", "import-gguf", str(gguf),
                           str(tmp_path / "m"), "--precision", "int4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[1/" in done.stderr and "weights kept bit for bit" in done.stdout
    assert (tmp_path / "m" / "model.onnx").is_file()
    bad = subprocess.run([sys.executable, "-m", "engine", "import-gguf", str(tmp_path / "no"),
                          str(tmp_path / "n")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert "is not a file" in bad.stderr and "fix:" in bad.stderr


def test_import_needs_no_onnx_package(gguf_dir, tok_dir, tmp_path):
    """The packaged app leaves ``onnx`` out: the importer writes the protobuf itself, and
    what it writes is a model the onnx package reads back node for node."""
    gguf = _gguf(gguf_dir, tok_dir, "qwen3-Q8_0-qknorm")
    script = ("import sys; sys.modules['onnx'] = None\n"
              "from engine.model.gguf import import_gguf\n"
              f"import_gguf({str(gguf)!r}, {str(tmp_path / 'm')!r})\n"
              "assert 'onnx' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    model = onnx.load(str(tmp_path / "m" / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GroupQueryAttention") == 2 and ops.count("SimplifiedLayerNormalization")
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    assert gqa.domain == "com.microsoft"
    assert {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}["num_heads"] == 4


def test_compute_fp32_keeps_the_gguf_arithmetic_for_four_bit_weights(gguf_dir, tok_dir,
                                                                      tmp_path):
    """``compute="fp32"`` keeps the GGUF's own fp32 arithmetic for 4-bit weights (closest to
    llama.cpp's results: bench/gguf_import.md); the default quantizes activations to 8 bits
    as the onnxruntime-genai builder's CPU exports do, and the logits move off the GGUF's."""
    gguf = _gguf(gguf_dir, tok_dir, "llama-Q4_0")
    ref = reference_logits(str(gguf), IDS)
    scale = np.abs(ref).max()
    fp32 = import_gguf(gguf, tmp_path / "fp32", compute="fp32").out_dir
    default = import_gguf(gguf, tmp_path / "int8").out_dir
    assert json.loads((fp32 / "gguf_import.json").read_text())["compute"] == "fp32"
    assert json.loads((default / "gguf_import.json").read_text())["compute"] == "int8"
    assert np.abs(_logits(fp32, IDS) - ref).max() < 1e-4 * scale
    assert np.abs(_logits(default, IDS) - ref).max() > 1e-3 * scale
    with pytest.raises(ModelLoadError, match="compute"):
        import_gguf(gguf, tmp_path / "bad", compute="int3")


@pytest.mark.parametrize("case", ["llama-Q4_1", "llama-Q4_K", "qwen3-Q6_K"])
def test_imported_heads_run_for_the_last_row_with_the_same_logits(gguf_dir, tok_dir, tmp_path,
                                                                  case):
    """A prefill of an imported folder computes the LM head for its last row only (the
    offset-corrected int4 heads of Q4_1 / K-quants included), and returns what the full
    graph does."""
    out = tmp_path / case
    import_gguf(_gguf(gguf_dir, tok_dir, case), out)
    pruned = Engine.load(out, EngineConfig(intra_op_threads=1))
    plain = Engine.load(out, EngineConfig(intra_op_threads=1, prune_logits=False))
    assert pruned.spec.logits_to_keep is not None and plain.spec.logits_to_keep is None
    ids = np.arange(3, 30, dtype=np.int64)
    np.testing.assert_array_equal(pruned.runner.forward(ids[:20]),
                                  plain.runner.forward(ids[:20]).copy())
    np.testing.assert_array_equal(pruned.runner.forward(ids[20:], all_logits=True),
                                  plain.runner.forward(ids[20:], all_logits=True))
    pruned.runner.reset()
    plain.runner.reset()
    np.testing.assert_array_equal(pruned.runner.forward(ids), plain.runner.forward(ids))
