import json
import shutil
from pathlib import Path

import onnx
import pytest

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.model.io_spec import resolve_io
from engine.model.model_dir import load_model_dir
from engine.runtime.describe import inspect_model


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def _spec(path: Path):
    model = load_model_dir(path)
    return model, resolve_io(model.graph.inputs, model.graph.outputs, model.declared,
                             has_gqa=model.graph.has_gqa, source=model.format)


def test_genai_export_with_symbolic_kv_dim_takes_head_size_from_config(reference_models_dir):
    model, spec = _spec(reference_models_dir / "tiny-genai-fp32")
    assert model.format == "genai"
    assert model.graph.inputs["past_key_values.0.key"].shape[3] == "kv_cache_dim"
    assert spec.decode_path == "shared_buffer"
    assert {(p.num_heads, p.head_dim) for p in spec.kv_pairs} == {(2, 16)}
    # 2 layers x (key + value) x 2 heads x 16 dims x 4 bytes
    assert spec.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert model.context_length == 512
    assert model.weights_bytes >= 4_524_288


def test_optimum_export_is_a_growing_cache_with_positions(reference_models_dir):
    model, spec = _spec(reference_models_dir / "tiny-optimum")
    assert model.format == "optimum"
    assert spec.decode_path == "growing"
    assert spec.position_ids == "position_ids"
    assert [p.output for p in spec.kv_pairs[:2]] == ["present.0.key", "present.0.value"]


def test_forged_layouts_pick_their_decode_paths(genai_model_dir, optimum_model_dir,
                                                 static_model_dir, genai_pruned_model_dir):
    assert _spec(genai_model_dir)[1].decode_path == "shared_buffer"
    assert _spec(optimum_model_dir)[1].decode_path == "growing"
    model, spec = _spec(static_model_dir)
    assert model.format == "metadata"
    assert spec.decode_path == "static_cache" and spec.static_max_len == 64
    pruned = _spec(genai_pruned_model_dir)[1]
    assert pruned.logits_last_only and not _spec(genai_model_dir)[1].logits_last_only


def test_inspect_reports_what_a_user_needs(genai_model_dir):
    report = inspect_model(genai_model_dir)
    assert report["format"] == "genai"
    assert report["decode_path"] == "shared_buffer"
    assert report["fim_family"] == "qwen"
    assert report["chat_template"] is True
    assert report["eos_token_ids"] == [0]
    assert report["kv"]["bytes_per_token"] > 0
    assert report["weights_bytes"] > 0
    assert report["io"]["input_ids"] == "input_ids"
    json.dumps(report)  # serialisable for --json


def test_folder_without_metadata_falls_back_to_names_with_a_warning(optimum_model_dir, tmp_path):
    folder = _copy(optimum_model_dir, tmp_path / "bare")
    (folder / "config.json").unlink()
    (folder / "generation_config.json").unlink(missing_ok=True)
    model, spec = _spec(folder)
    assert model.format == "convention"
    assert any("guessed" in w for w in model.warnings)
    assert spec.decode_path == "growing"


def test_missing_tokenizer_is_named_with_a_fix(genai_model_dir, tmp_path):
    folder = _copy(genai_model_dir, tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json") as err:
        load_model_dir(folder)
    assert err.value.hint


def test_truncated_onnx_file_is_reported_as_truncated(genai_model_dir, tmp_path):
    folder = _copy(genai_model_dir, tmp_path / "m")
    data = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="truncated|not a readable ONNX"):
        load_model_dir(folder)


def test_missing_and_truncated_external_data(genai_model_dir, tmp_path):
    folder = _copy(genai_model_dir, tmp_path / "m")
    data_file = folder / "model.onnx.data"
    payload = data_file.read_bytes()
    data_file.write_bytes(payload[: len(payload) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model_dir(folder)
    data_file.unlink()
    with pytest.raises(ModelLoadError, match="model.onnx.data.*missing") as err:
        load_model_dir(folder)
    assert "download" in (err.value.hint or "")


def test_unknown_graph_input_is_refused_by_name(optimum_model_dir, tmp_path):
    folder = _copy(optimum_model_dir, tmp_path / "m")
    proto = onnx.load(str(folder / "model.onnx"))
    proto.graph.input.append(
        onnx.helper.make_tensor_value_info("mystery_flag", onnx.TensorProto.INT64, [1]))
    onnx.save(proto, str(folder / "model.onnx"))
    with pytest.raises(ModelLoadError, match="mystery_flag"):
        _spec(folder)


def test_metadata_asking_for_unsupported_capabilities_is_refused(static_model_dir, tmp_path):
    folder = _copy(static_model_dir, tmp_path / "m")
    meta = folder / "inference_metadata.yaml"
    meta.write_text(meta.read_text() + "recurrent_state_pairs: [{input: s0, output: s1}]\n")
    with pytest.raises(UnsupportedModelError, match="recurrent_state_pairs"):
        load_model_dir(folder)


def test_metadata_naming_a_missing_tensor_lists_the_real_ones(static_model_dir, tmp_path):
    folder = _copy(static_model_dir, tmp_path / "m")
    meta = folder / "inference_metadata.yaml"
    meta.write_text(meta.read_text().replace("logits: logits", "logits: scores"))
    with pytest.raises(ModelLoadError, match="'scores'.*logits"):
        _spec(folder)


def test_not_a_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model_dir(tmp_path / "nope")


def test_corrupt_genai_config_names_the_file(genai_model_dir, tmp_path):
    folder = _copy(genai_model_dir, tmp_path / "m")
    (folder / "genai_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="genai_config.json is not valid JSON"):
        load_model_dir(folder)


# --- metadata that contradicts the graph -------------------------------------------------


def _with_config(src: Path, dst: Path, **edits) -> Path:
    """A copy of a forged genai folder with genai_config.json's model / decoder keys set."""
    folder = _copy(src, dst)
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    for key, value in edits.items():
        where = config["model"] if key == "context_length" else config["model"]["decoder"]
        where[key] = value
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("edit", "said", "graph"), [
    ({"head_size": 32}, "model.decoder.head_size is 32", "a head size of 16"),
    ({"num_key_value_heads": 4}, "model.decoder.num_key_value_heads is 4",
     "a KV head count of 2"),
    ({"num_hidden_layers": 3}, "model.decoder.num_hidden_layers is 3", "the graph has 2 layers"),
    ({"context_length": 512}, "model.context_length is 512",
     "rotary table (cos_cache) covers 256 positions"),
    ({"context_length": 0}, "model.context_length is 0", "expected a positive number"),
    ({"context_length": -5}, "model.context_length is -5", "expected a positive number"),
    ({"context_length": "4k"}, "model.context_length is '4k'", "expected a positive number"),
])
def test_genai_config_that_disagrees_with_the_graph_is_refused_naming_both(
        genai_model_dir, tmp_path, edit, said, graph):
    folder = _with_config(genai_model_dir, tmp_path / "m", **edit)
    with pytest.raises(ModelLoadError) as caught:
        load_model_dir(folder)
    assert said in caught.value.message and graph in caught.value.message
    assert str(folder / "genai_config.json") in caught.value.message
    assert caught.value.hint


def test_wrong_head_size_of_an_int4_graph_is_refused_at_load(genai_model_dir, tmp_path):
    """The head size is read from the int4 output projection (MatMulNBits' K) too; the engine
    refuses to load instead of failing inside GroupQueryAttention at the first token."""
    from engine import Engine, EngineConfig
    from tests.forge.quant import quantize_int4

    int4 = quantize_int4(genai_model_dir, tmp_path / "int4")
    attention = load_model_dir(int4).graph.attention
    assert attention is not None and attention.head_size == 16
    wrong = _with_config(int4, tmp_path / "wrong", head_size=8)
    with pytest.raises(ModelLoadError, match="head_size is 8, but the graph's attention has a "
                       "head size of 16"):
        Engine.load(wrong, EngineConfig(intra_op_threads=1))


def test_a_shorter_context_than_the_graph_allows_is_taken(genai_model_dir, tmp_path):
    folder = _with_config(genai_model_dir, tmp_path / "m", context_length=128)
    assert load_model_dir(folder).context_length == 128
    assert load_model_dir(genai_model_dir).context_length == 256
