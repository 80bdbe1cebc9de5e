"""Where the built-in model that ships with the app lives, and the other shipped resources.

``resources/models/smollm2-135m-instruct`` (SmolLM2-135M-Instruct, int4, built by
``tools/import_default_model.py``) makes a fresh install chat and complete code offline.
``resources/`` (the model and the app's icons) is found in one place, :func:`resources_dir`:

- in a frozen (PyInstaller) app, under ``sys._MEIPASS`` (installer/onnx-local-llm.spec);
- in the source tree (a checkout, an editable install), beside ``engine/``;
- in a wheel install, as the package ``onnx_local_llm_resources``, which setup.py maps onto
  the same ``resources/`` folder (package data), so ``pip install .`` ships it too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
#: The import name of ``resources/`` in a wheel (setup.py's package_dir).
RESOURCES_PACKAGE = "onnx_local_llm_resources"


def resources_dir() -> Path:
    """The folder of the shipped resources (``models/``, ``icons/``): see the module
    docstring for where each kind of install keeps it."""
    bundle = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and isinstance(bundle, str):
        return Path(bundle) / "resources"
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "resources").is_dir():
        return root / "resources"  # a source tree
    try:
        spec = importlib.util.find_spec(RESOURCES_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return root / "resources"  # not installed: nothing is there, callers say so


def _candidates() -> list[Path]:
    return [resources_dir() / "models" / DEFAULT_MODEL_NAME]


def default_model_dir() -> Path | None:
    """The shipped default model's folder, or None when it is not there (or incomplete:
    no ``genai_config.json``)."""
    for path in _candidates():
        if (path / "genai_config.json").is_file():
            return path
    return None
