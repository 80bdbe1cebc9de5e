"""The protobuf scanner agrees with the onnx package and never loads the weights."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.model.onnx_scan import DETAILED_OPS, ScanError, scan_onnx

ROOT = Path(__file__).resolve().parents[3]
#: Scans the model in argv[1] in a fresh process: its peak RSS (VmHWM, which starts anew at
#: exec, unlike ru_maxrss) before the scan is the interpreter and the imports alone, so the
#: growth is what the scan itself held.
SCAN_RSS = """
import json, re, sys
from pathlib import Path
from engine.model.model_dir import scan_graph
def peak_kib():
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
before = peak_kib()
summary = scan_graph(Path(sys.argv[1])) if sys.argv[2] == "scan" else \\
    Path(sys.argv[1]).read_bytes()
after = peak_kib()
print(json.dumps({"grown_mib": (after - before) / 1024,
                  "inline": getattr(summary, "inline_weights_bytes", None),
                  "control_flow": getattr(summary, "top_level_control_flow", None)}))
"""


def _scan_rss(path: Path, how: str = "scan") -> dict:
    done = subprocess.run([sys.executable, "-c", SCAN_RSS, str(path), how], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


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
    assert [(t.name, t.data_location, t.dims) for t in scanned.initializers] == [
        (t.name, t.data_location, list(t.dims)) for t in proto.graph.initializer]
    detailed = [n for n in proto.graph.node if n.op_type in DETAILED_OPS]
    assert [(n.op_type, n.inputs, n.outputs, n.ints) for n in scanned.nodes] == [
        (n.op_type, list(n.input), list(n.output),
         {a.name: a.i for a in n.attribute if a.type == onnx.AttributeProto.INT})
        for n in detailed]
    if which == "genai":  # GroupQueryAttention's negative local_window_size included
        assert {n.ints["local_window_size"] for n in scanned.nodes
                if n.op_type == "GroupQueryAttention"} == {-1}
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


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads Linux's VmHWM")
def test_large_inline_weights_are_skipped_not_read(tmp_path):
    path = _model_with_big_inline_weight(tmp_path / "big.onnx", 64, control_flow=True)
    scanned = _scan_rss(path)
    assert scanned["inline"] >= 64 * 2**20
    assert scanned["control_flow"]  # the If node after the 64 MiB weight is seen
    assert scanned["grown_mib"] < 16  # the payload was skipped, not read
    # the same measure sees a reader that does read the file
    assert _scan_rss(path, "read")["grown_mib"] >= 64


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
