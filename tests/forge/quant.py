"""int4 weight quantization of a forged model with ONNX Runtime's own `MatMulNBitsQuantizer`.

The quantizer needs the `onnx-ir` package (in the `test` extra). Every MatMul with a constant
weight becomes a com.microsoft `MatMulNBits` (asymmetric, blocks of `block_size` rows of K),
which is what onnxruntime-genai's builder emits for `-p int4 -e cpu`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer


def quantize_int4(
    src_dir: Path, dst_dir: Path, block_size: int = 32, *, accuracy_level: int = 4
) -> Path:
    """Copy a forged model folder, turning every constant-weight MatMul into int4 MatMulNBits."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src_dir / "model.onnx"), load_external_data=True)
    # The quantizer logs every node at INFO.
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=False,
                                     accuracy_level=accuracy_level)
    quantizer.process()
    quantized = quantizer.model.model
    for path in src_dir.iterdir():
        if path.is_file() and not path.name.startswith("model.onnx"):
            shutil.copyfile(path, dst_dir / path.name)
    for stale in (dst_dir / "model.onnx", dst_dir / "model.onnx.data"):
        stale.unlink(missing_ok=True)
    onnx.save_model(quantized, str(dst_dir / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data",
                    size_threshold=1024)
    return dst_dir
