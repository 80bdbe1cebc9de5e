"""The reference peer, onnxruntime-genai, lives in the ``peers`` extra: it requires the CPU
``onnxruntime``, which must never come beside onnxruntime-gpu or -directml (they share an
import name). The tests that compare against it skip, saying so, where it is absent."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

REASON = ("onnxruntime-genai (the reference peer) is not installed: it is in the peers "
          "extra, pip install -e '.[cpu,peers]' (never with cuda or directml)")

#: For a test that needs the peer from its start.
needs_onnxruntime_genai = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime_genai") is None, reason=REASON)


def onnxruntime_genai() -> ModuleType:
    """The peer's module, or a skip of the running test with :data:`REASON`."""
    return pytest.importorskip("onnxruntime_genai", reason=REASON)
