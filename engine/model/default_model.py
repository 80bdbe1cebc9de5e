"""Where the built-in model that ships with the app lives.

``resources/models/smollm2-135m-instruct`` (SmolLM2-135M-Instruct, int4, built by
``tools/import_default_model.py``) makes a fresh install chat and complete code offline.
In the source tree it is under the repository root; in a frozen (PyInstaller) app under
``sys._MEIPASS``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
_RELATIVE = Path("resources") / "models" / DEFAULT_MODEL_NAME


def _candidates() -> list[Path]:
    roots: list[Path] = []
    bundle = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and isinstance(bundle, str):
        roots.append(Path(bundle))
    roots.append(Path(__file__).resolve().parents[2])  # the source tree's root
    return [root / _RELATIVE for root in roots]


def default_model_dir() -> Path | None:
    """The shipped default model's folder, or None when it is not there (or incomplete:
    no ``genai_config.json``)."""
    for path in _candidates():
        if (path / "genai_config.json").is_file():
            return path
    return None
