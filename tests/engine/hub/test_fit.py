"""The fit label says what the governor then does: a tiny ONNX model (built in code) served
by the Hub stand-in is labelled from the Hub's file sizes and its genai_config.json, then
loaded under the same RAM limit; one limit per label."""

from __future__ import annotations

import json

import pytest

from engine import Engine, EngineConfig, kernels
from engine.errors import ResourceLimitError
from engine.hub.bandwidth import ReadSpeed, read_bandwidth, read_speed
from engine.hub.browse import variants
from engine.hub.fit import FITS, SHORTER, SPEED_CONTEXT, TOO_BIG, assess, import_factor
from engine.hub.remote import ModelShape
from engine.memory.limits import format_bytes
from engine.model.gguf import import_gguf
from engine.model.kv16_pass import I8_SCALE_BYTES
from engine.model.model_dir import load_model_dir
from tests.app.hub_standin import HubStandin
from tests.engine.hub.repos import GGUF_REPO, ONNX_REPO, gguf_repo, onnx_repo
from tests.forge import ForgeSpec

MIB = 1024 * 1024
# 4 layers x 8 KV heads x 64 x float32 x (K, V): 16 KiB of KV a token, 32 MiB for the
# 2048-token context (half in float16, which the engine keeps on the CPU where its kernel
# runs attention); a 8192-token vocabulary makes about 8.6 MiB of weights
SPEC = ForgeSpec(layers=4, hidden=128, heads=8, kv_heads=8, head_dim=64, context=2048,
                 vocab=8192)
#: Bytes of a KV value as the engine keeps it on the CPU (engine.hub.fit.engine_kv).
KV_VALUE = 2 if kernels.library() is not None and kernels.f16kv_ready() else 4
#: Where the CPU runs an int16 cache fast the engine keeps it ("auto"): rows of 64 whole
#: numbers and a scale, 4 x 8 x 65 x 2 bytes x (K, V) = 8,320 bytes a token.
I16 = kernels.library() is not None and kernels.i16kv_preferred()
KV_TOKEN = 4 * 8 * (64 + 1) * 2 * 2 if I16 else 4 * 1024 * KV_VALUE
PAGE = 32 * KV_TOKEN  # the default 32-token page
#: Under a limit too small for the context in float16 the engine keeps int8 KV: rows of 64
#: values and a 2-byte scale, 4 x 8 x 66 x (K, V) = 4,224 bytes a token.
INT8 = kernels.library() is not None and kernels.i8kv_ready() and KV_VALUE == 2
I8_PAGE = 32 * 4 * 8 * (64 + I8_SCALE_BYTES) * 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = onnx_repo(tmp_path_factory.mktemp("onnx"), SPEC)
    with HubStandin({ONNX_REPO: folder}) as hub:
        yield hub, folder


def _label(hub, limit: str):
    [variant] = variants(ONNX_REPO, endpoint=hub.url,
                         config=EngineConfig(host_ram_limit=limit, provider="cpu"))
    return variant.fit


def _limit(weights: int, extra: int) -> str:
    return f"{weights + extra}"


def test_each_label_agrees_with_what_the_governor_does_at_load(served):
    hub, folder = served
    weights = _label(hub, "auto").weights_bytes
    actual = load_model_dir(folder).weights_bytes
    assert abs(weights - actual) < 64 * 1024  # the files' sizes: weights and the graph

    # fits: the whole context's KV (32 MiB) and a little more
    fit = _label(hub, _limit(weights, 40 * MIB))
    assert fit.text == FITS and fit.kv_bytes_per_token == KV_TOKEN
    assert fit.context == 2048
    engine = Engine.load(folder, EngineConfig(host_ram_limit=_limit(weights, 40 * MIB),
                                              intra_op_threads=1))
    budget = engine.governor.budget()
    assert budget is not None and budget.refusal is None
    assert budget.kv_tokens is not None and budget.kv_tokens >= engine.context_length

    # 10 MiB and half a page of KV room: 20 pages of 32 float32 tokens = 640 (40 pages,
    # 1280 tokens in float16, 39 in int16); where the engine can, it keeps int8 KV then,
    # which holds the whole context
    ten = _label(hub, _limit(weights, 10 * MIB + PAGE // 2))
    engine = Engine.load(folder, EngineConfig(host_ram_limit=_limit(weights, 10 * MIB
                                                                     + PAGE // 2),
                                              intra_op_threads=1))
    budget = engine.governor.budget()
    assert budget is not None and budget.refusal is None and budget.kv_tokens is not None
    if INT8:
        assert ten.label == FITS and ten.kv_bytes_per_token == I8_PAGE // 32
        assert engine.spec.kv_pairs[0].dtype == "int8"
        assert engine.spec.kv_bytes_per_token == ten.kv_bytes_per_token
        assert budget.kv_tokens >= engine.context_length
        extra = 5 * MIB + I8_PAGE // 2  # fits with a shorter context: 39 int8 pages
        short = _label(hub, _limit(weights, extra))
        engine = Engine.load(folder, EngineConfig(host_ram_limit=_limit(weights, extra),
                                                  intra_op_threads=1))
        budget = engine.governor.budget()
        assert budget is not None and budget.refusal is None
        want = (5 * MIB + I8_PAGE // 2) // I8_PAGE * 32
    else:
        short, want = ten, 640 * 4 // KV_VALUE
    assert short.label == SHORTER
    assert short.text == f"fits with a shorter context ({short.kv_tokens} tokens)"
    assert budget.kv_tokens == short.kv_tokens == want < engine.context_length

    # too big: the weights alone are over the limit, and the governor refuses with the
    # same figures
    big = _label(hub, "4MiB")
    assert big.label == TOO_BIG and big.refusal is not None
    with pytest.raises(ResourceLimitError) as err:
        Engine.load(folder, EngineConfig(host_ram_limit="4MiB", intra_op_threads=1))
    for figure in ("under the host RAM limit of 4MiB", format_bytes(I8_PAGE if INT8 else PAGE),
                   "raise --host-ram-limit to at least"):
        assert figure in big.refusal and figure in str(err.value)
    assert "4MiB" in big.details() and big.text == "too big"


def test_a_context_set_shorter_in_the_configuration_is_the_one_judged(served):
    hub, _folder = served
    weights = _label(hub, "auto").weights_bytes
    fit = variants(ONNX_REPO, endpoint=hub.url, config=EngineConfig(
        host_ram_limit=_limit(weights, 10 * MIB + PAGE // 2), kv_max_len=512,
        provider="cpu"))[0].fit
    assert fit.label == FITS and fit.context == 512


def test_gguf_weights_after_import_are_estimated_within_a_tenth(tmp_path):
    folder = gguf_repo(tmp_path)
    with HubStandin({GGUF_REPO: folder}) as hub:
        found = variants(GGUF_REPO, endpoint=hub.url)
    for v in found:
        imported = import_gguf(folder / v.path, tmp_path / v.quant)
        actual = load_model_dir(imported.out_dir).weights_bytes
        assert abs(v.fit.weights_bytes - actual) / actual < 0.10, (v.quant, actual)
        assert v.fit.weights_bytes == int(v.download_bytes * import_factor(v.quant))


def test_read_bandwidth_is_measured_once_and_cached(tmp_path):
    cache = tmp_path / "bandwidth.json"
    first = read_bandwidth(cache)
    assert first > 1e8  # more than 100 MB/s on any machine
    saved = json.loads(cache.read_text())
    saved["bytes_per_second"] = 12345.0
    cache.write_text(json.dumps(saved))
    assert read_bandwidth(cache) == 12345.0  # not measured again
    saved["machine"] = "another machine"
    cache.write_text(json.dumps(saved))
    assert read_bandwidth(cache) != 12345.0  # another machine: measured


def test_int4_models_are_expected_at_the_int4_rate_plus_a_cost_per_layer(tmp_path):
    """The figures are measured once, together (the fp32 and int4 chains, the built-in
    model's decode for the per-layer cost) and cached; a quantized model's step is its
    layers times that cost plus its bytes at the int4 rate, an fp32 model's at the fp32
    rate."""
    cache = tmp_path / "bandwidth.json"
    speed = read_speed(cache)
    saved = json.loads(cache.read_text())
    assert saved["layer_model"] == "smollm2-135m-instruct"  # int4, decoded once
    assert speed.bytes_per_second == saved["bytes_per_second"] > 1e8
    assert speed.int4_bytes_per_second == saved["int4_bytes_per_second"] > 1e8
    assert 0 <= speed.layer_seconds == saved["layer_seconds"] < 0.01
    saved.update(int4_bytes_per_second=5e8, layer_seconds=1e-4)
    cache.write_text(json.dumps(saved))
    assert read_speed(cache) == ReadSpeed(saved["bytes_per_second"], 5e8, 1e-4)  # cached
    shape = ModelShape(4, 8, 64, 2048, 4)
    read = 100 * MIB - 2048 * 64 * 4 + shape.kv_bytes_per_token * SPEED_CONTEXT
    figures = ReadSpeed(1e9, 5e8, 1e-4)
    config = EngineConfig(kv_dtype="float32")  # the shape's float32 KV, as exported
    fp32 = assess(100 * MIB, shape, config, bandwidth=figures)
    int4 = assess(100 * MIB, shape, config, bandwidth=figures, quantized=True)
    assert fp32.tokens_per_second == round(1 / (4e-4 + read / 1e9), 2)
    assert int4.tokens_per_second == round(1 / (4e-4 + read / 5e8), 2)


def test_a_long_contexts_rotary_tables_are_not_counted_as_read_each_step():
    """A builder export or GGUF import keeps cos and sin tables for every position of its
    context (34 MB for a 1B model's 131,072 tokens); a step reads one row of them."""
    short, long = ModelShape(16, 8, 64, 2048, 4), ModelShape(16, 8, 64, 131072, 4)
    kv = short.kv_bytes_per_token * SPEED_CONTEXT
    config = EngineConfig(kv_max_len=2048, kv_dtype="float32")
    for shape in (short, long):
        fit = assess(100 * MIB, shape, config, bandwidth=1e10)
        tables = 2 * shape.context * 32 * 4
        assert fit.tokens_per_second == round(1e10 / (100 * MIB - tables + kv), 2)
