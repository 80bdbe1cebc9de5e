"""The protobuf scanner agrees with the onnx package and never loads the weights."""

import resource

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.model_dir import scan_graph
from engine.onnx_scan import ScanError, scan_onnx


def _dims(value_info):
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("which", ["genai", "optimum", "static"])
def test_scan_matches_the_onnx_package(which, genai_model_dir, optimum_model_dir,
                                       static_model_dir):
    folder = {"genai": genai_model_dir, "optimum": optimum_model_dir,
              "static": static_model_dir}[which]
    path = folder / "model.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    scanned = scan_onnx(path)
    assert scanned.op_types == [n.op_type for n in proto.graph.node]
    assert [(v.name, v.elem_type, v.shape) for v in scanned.inputs] == [
        (v.name, v.type.tensor_type.elem_type, _dims(v)) for v in proto.graph.input]
    assert [(v.name, v.shape) for v in scanned.outputs] == [
        (v.name, _dims(v)) for v in proto.graph.output]
    assert [(t.name, t.data_location) for t in scanned.initializers] == [
        (t.name, t.data_location) for t in proto.graph.initializer]
    assert scanned.opsets == {(o.domain or "ai.onnx"): o.version for o in proto.opset_import}


def _model_with_big_inline_weight(path, megabytes, control_flow=False):
    rows = megabytes * 256  # 1024 float32 = 4 KiB per row
    weight = np.ones((rows, 1024), dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    inits = [numpy_helper.from_array(weight, "w")]
    out = "y"
    if control_flow:
        def branch(name):
            return helper.make_graph(
                [helper.make_node("Identity", ["y"], [name])], name, [],
                [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)])
        nodes.append(helper.make_node("If", ["c"], ["out"], then_branch=branch("z1"),
                                      else_branch=branch("z2")))
        inits.append(numpy_helper.from_array(np.array(True), "c"))
        out = "out"
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", rows])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], initializer=inits)
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_large_inline_weights_are_skipped_not_read(tmp_path):
    path = _model_with_big_inline_weight(tmp_path / "big.onnx", 64, control_flow=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summary = scan_graph(path)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert summary.inline_weights_bytes >= 64 * 2**20
    assert summary.top_level_control_flow  # the If node after the 64 MiB weight is seen
    assert grown_mib < 32  # the payload was skipped, not copied into Python


def test_truncated_and_foreign_files_are_refused(genai_model_dir, tmp_path):
    data = (genai_model_dir / "model.onnx").read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ScanError):
        scan_onnx(cut)
    text = tmp_path / "readme.onnx"
    text.write_text("this is not a model\n" * 10)
    with pytest.raises(ScanError):
        scan_onnx(text)
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ScanError, match="empty"):
        scan_onnx(tmp_path / "empty.onnx")
