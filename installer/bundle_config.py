"""What goes into the bundle: one place for the spec, the build script and the tests.

Plain Python (no PyInstaller import) so that the fast tests can read it too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
APP_NAME = "ONNX Local LLM"
EXE_NAME = "onnx-local-llm"
CLI_EXE_NAME = "onnx-local-llm-cli"  # Windows only: a console twin for --selftest
BUNDLE_ID = "io.github.onnx-local-llm"
PUBLISHER = "ONNX Local LLM contributors"

#: ONNX Runtime distributions that all install the import package `onnxruntime`
#: (engine.runtime.ORT_VARIANTS, repeated here so the build needs no engine import).
ORT_VARIANTS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml",
                "onnxruntime-openvino", "onnxruntime-qnn")

#: Imported only through importlib (the main window builds its views by name) or by
#: libraries at run time (uvicorn picks its loop, protocol and lifespan by name).
HIDDEN_IMPORT_PACKAGES = ("app", "engine")
HIDDEN_IMPORTS = (
    "uvicorn.loops.auto", "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.auto", "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto", "uvicorn.lifespan.on", "uvicorn.lifespan.off",
    "uvicorn.logging",
    "yaml",  # engine.model_dir imports it inside a function
    "pynvml",  # engine.capacity, for NVIDIA GPUs (optional at run time)
    "PySide6.QtCharts", "PySide6.QtNetwork",
)
#: Optional at run time; collected when installed (uvicorn's fast paths).
OPTIONAL_HIDDEN_IMPORTS = ("uvicorn.protocols.http.httptools_impl", "httptools", "uvloop")

#: Never in the bundle: test and dev tools, ML stacks, Qt modules the app does not use.
EXCLUDES = (
    "torch", "torchvision", "torchaudio", "tensorflow", "jax", "transformers",
    "matplotlib", "PIL", "pandas", "scipy", "sympy", "sklearn", "IPython",
    "tkinter", "_tkinter", "turtle", "idlelib", "pydoc_data",
    "pytest", "_pytest", "pytestqt", "schemathesis", "hypothesis", "openai",
    "mypy", "ruff", "setuptools", "pkg_resources", "distutils", "pip",
    "hf_xet",  # Xet transfers: engine/hub/download.py streams files over plain HTTPS
    # huggingface_hub's command line and its terminal UI (the library needs neither)
    "huggingface_hub.cli", "huggingface_hub.inference._mcp", "rich", "pygments",
    "markdown_it", "typer",
    "onnxruntime_genai", "onnx", "onnx_ir", "onnxscript",
    "onnxruntime.quantization", "onnxruntime.transformers", "onnxruntime.tools",
    "onnxruntime.training",
    "tests", "bench", "tools",
    "PySide6.QtWebEngineCore", "PySide6.QtWebEngineWidgets", "PySide6.QtWebEngineQuick",
    "PySide6.QtWebChannel", "PySide6.QtWebSockets", "PySide6.QtWebView",
    "PySide6.Qt3DCore", "PySide6.Qt3DRender", "PySide6.Qt3DInput", "PySide6.Qt3DLogic",
    "PySide6.Qt3DExtras", "PySide6.Qt3DAnimation",
    "PySide6.QtQml", "PySide6.QtQuick", "PySide6.QtQuickWidgets",
    "PySide6.QtQuickControls2", "PySide6.QtQuick3D",
    "PySide6.QtMultimedia", "PySide6.QtMultimediaWidgets", "PySide6.QtSpatialAudio",
    "PySide6.QtTextToSpeech", "PySide6.QtPdf", "PySide6.QtPdfWidgets",
    "PySide6.QtDesigner", "PySide6.QtUiTools", "PySide6.QtHelp", "PySide6.QtTest",
    "PySide6.QtLocation", "PySide6.QtPositioning", "PySide6.QtSensors",
    "PySide6.QtBluetooth", "PySide6.QtNfc", "PySide6.QtSerialPort",
    "PySide6.QtSerialBus", "PySide6.QtRemoteObjects", "PySide6.QtScxml",
    "PySide6.QtDataVisualization", "PySide6.QtGraphs", "PySide6.QtGraphsWidgets",
    "PySide6.QtSql", "PySide6.QtHttpServer", "PySide6.QtNetworkAuth",
    "PySide6.QtStateMachine", "PySide6.QtAxContainer",
)

#: Qt plug-ins kept, by folder; None keeps the whole folder. Everything else is dropped.
QT_PLUGINS: dict[str, tuple[str, ...] | None] = {
    "platforms": ("xcb", "offscreen", "wayland", "minimal", "windows", "cocoa"),
    # native file dialogs through the xdg portal; not gtk3: it drags the build machine's
    # cairo/pango/gdk into the bundle, to be mixed with the user's GTK at run time
    "platformthemes": ("xdgdesktopportal",),
    "platforminputcontexts": ("compose", "ibus"),  # input methods (not the QML keyboard)
    "xcbglintegrations": None,
    "wayland-decoration-client": None,
    "wayland-graphics-integration-client": None,
    "wayland-shell-integration": None,
    "imageformats": ("ico", "jpeg", "gif", "svg", "icns"),
    "iconengines": None,  # SVG theme icons
    "styles": None,  # Windows 11 / macOS styles
    "tls": None,  # https to a remote server
    "networkinformation": None,
}

#: Qt libraries that only dropped plug-ins or excluded modules want.
QT_LIBS_DROPPED = ("Qt6Pdf", "Qt6Quick", "Qt6Qml", "Qt6WebEngine", "Qt63D", "Qt6Multimedia",
                   "Qt6VirtualKeyboard", "Qt6EglFsKmsSupport", "Qt6EglFSDeviceIntegration",
                   "Qt6Designer", "Qt6Sql", "Qt6Location",
                   "Qt6Positioning", "Qt6Sensors", "Qt6ShaderTools", "Qt6Graphs",
                   "Qt6DataVisualization", "Qt6Test", "Qt6Help", "Qt6WebSockets",
                   "Qt6WebChannel", "Qt6QuickControls2", "Qt6Quick3D")

#: Qt data folders the app does not read (it installs no QTranslator).
QT_FOLDERS_DROPPED = ("translations",)

#: Files under resources/ that are never needed at run time.
RESOURCE_JUNK = ("__pycache__", ".pyc", ".DS_Store", ".gitkeep")


def project_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``[project] version`` of pyproject.toml (read by hand: Python 3.10 has no tomllib)."""
    text = pyproject.read_text(encoding="utf-8")
    section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = re.search(r'^version\s*=\s*"([^"]+)"', section.group(1) if section else "", re.M)
    if not found:
        raise ValueError(f"{pyproject}: no version in [project]")
    return found.group(1)


def expected_ort_variant(platform: str = sys.platform, cuda: bool = False) -> str:
    """The onnxruntime distribution a bundle for ``platform`` is built with."""
    if platform == "win32":
        return "onnxruntime-directml"
    if cuda:
        if platform == "darwin":
            raise ValueError("there is no CUDA build of ONNX Runtime for macOS")
        return "onnxruntime-gpu"
    return "onnxruntime"


def keep_qt_file(dest: str) -> bool:
    """False for a Qt plug-in or library the app does not need (``dest``: bundle path)."""
    parts = PurePosixPath(dest.replace("\\", "/")).parts
    name = parts[-1]
    if "plugins" in parts:
        at = parts.index("plugins")
        if len(parts) < at + 3:
            return True  # a file directly in plugins/ (none are known)
        folder = parts[at + 1]
        if folder not in QT_PLUGINS:
            return False
        wanted = QT_PLUGINS[folder]
        if wanted is None:
            return True
        stem = name.removeprefix("lib").split(".")[0].lower()
        return any(stem.startswith((want, f"q{want}")) for want in wanted)
    if any(folder in parts for folder in QT_FOLDERS_DROPPED):
        return False
    stem = name.removeprefix("lib").split(".")[0]
    return not any(stem.startswith(lib) for lib in QT_LIBS_DROPPED)


def is_resource_junk(path: str) -> bool:
    return any(part == junk or part.endswith(junk)
               for part in PurePosixPath(path.replace("\\", "/")).parts
               for junk in RESOURCE_JUNK)
