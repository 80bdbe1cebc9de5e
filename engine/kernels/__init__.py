"""Operators of the engine's own for ONNX Runtime's CPU provider, built from C at install.

`decode_attention.c` is GroupQueryAttention with a decode step of its own (why, in the file).
setuptools compiles it as an optional extension (setup.py) to `decode_attention.ortops`;
ONNX Runtime loads it with `SessionOptions.register_custom_ops_library`, Python never
imports it. Where it was not built (no C compiler at install), `library()` is None and
graphs keep ONNX Runtime's kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

#: "0": run without the engine's kernels (a comparison, or a suspected bug); "portable":
#: their plain C loops even where the CPU has AVX2 (the tests cover both).
ENV = "ONNX_GENAI_KERNELS"
#: What setup.py builds (named so that no importer takes it for a Python module).
LIBRARY = Path(__file__).resolve().parent / "decode_attention.ortops"


def library() -> Path | None:
    """The compiled kernels' library, or None (not built, or turned off by the variable)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    return LIBRARY if LIBRARY.is_file() else None
