"""Fast checks that the packaging files agree with each other and with the project:
the .desktop entry, the Inno Setup script, the icons, the spec, the build's variant check.
No PyInstaller needed."""

from __future__ import annotations

import ast
import configparser
import os
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from installer import bundle_config as cfg
from installer.build import BuildError, check_variant

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "installer"
ICONS = ROOT / "resources" / "icons"
DESKTOP = INSTALLER / "linux" / "onnx-local-llm.desktop"
ISS = INSTALLER / "windows" / "onnx-local-llm.iss"
SPEC = INSTALLER / "onnx-local-llm.spec"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# --- icons --------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [16, 24, 32, 48, 64, 128, 256, 512])
def test_png_icons_have_their_size(size: int) -> None:
    assert png_size(ICONS / f"app-{size}.png") == (size, size)


def test_window_icon_is_256_px() -> None:  # app/launch.py loads resources/icons/app.png
    assert png_size(ICONS / "app.png") == (256, 256)


def test_ico_holds_16_to_256_px_png_entries() -> None:
    data = (ICONS / "app.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind) == (0, 1)
    sizes = set()
    for i in range(count):
        width, height, _, _, _, _, length, offset = struct.unpack(
            "<BBBBHHII", data[6 + 16 * i: 22 + 16 * i])
        side = width or 256
        assert (height or 256) == side
        blob = data[offset: offset + length]
        assert blob[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", blob[16:24]) == (side, side)
        sizes.add(side)
    assert {16, 32, 48, 256} <= sizes


def test_icns_is_well_formed() -> None:
    data = (ICONS / "app.icns").read_bytes()
    assert data[:4] == b"icns"
    assert struct.unpack(">I", data[4:8])[0] == len(data)
    kinds, at = set(), 8
    while at < len(data):
        kind, length = data[at: at + 4], struct.unpack(">I", data[at + 4: at + 8])[0]
        kinds.add(kind)
        at += length
    assert at == len(data)
    assert {b"ic07", b"ic08", b"ic09"} <= kinds  # 128, 256, 512


def test_svg_icon_parses() -> None:
    root = ET.parse(ICONS / "app.svg").getroot()
    assert root.tag.endswith("svg")
    assert root.get("viewBox") == "0 0 256 256"


# --- Linux .desktop -----------------------------------------------------------------------

def desktop_entry() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(DESKTOP.read_text(encoding="utf-8"))
    assert parser.sections() == ["Desktop Entry"]
    return parser["Desktop Entry"]


def test_desktop_entry_has_the_required_keys() -> None:
    entry = desktop_entry()
    for key in ("Name", "Exec", "Icon", "Type", "Categories"):
        assert entry.get(key), f"{DESKTOP.name} lacks {key}"
    assert entry["Type"] == "Application"
    assert entry["Name"] == cfg.APP_NAME
    assert entry["Exec"].split()[0] == cfg.EXE_NAME
    assert entry["Icon"] == cfg.EXE_NAME  # install.sh installs the icons under this name
    assert entry["Categories"].endswith(";")
    assert entry["Terminal"] == "false"
    assert entry["StartupWMClass"] == cfg.EXE_NAME


def test_desktop_file_validate_accepts_it() -> None:
    tool = shutil.which("desktop-file-validate")
    if tool is None:
        pytest.skip("desktop-file-validate is not installed (apt-get install "
                    "desktop-file-utils); the key checks above still ran")
    done = subprocess.run([tool, str(DESKTOP)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "error" not in (done.stdout + done.stderr).lower()


def test_linux_scripts_are_executable_and_consistent() -> None:
    for name in ("install.sh", "AppRun"):
        path = INSTALLER / "linux" / name
        assert os.access(path, os.X_OK), f"{path} is not executable"
        assert path.read_text(encoding="utf-8").startswith("#!/bin/sh")
    install = (INSTALLER / "linux" / "install.sh").read_text(encoding="utf-8")
    assert "NAME=onnx-local-llm" in install
    for size in (16, 32, 48, 256):
        assert str(size) in install


# --- Windows Inno Setup -------------------------------------------------------------------

def iss_defines() -> dict[str, str]:
    text = ISS.read_text(encoding="utf-8")
    return dict(re.findall(r'^\s*#define\s+(\w+)\s+"([^"]*)"', text, re.M))


def test_iss_names_the_project_name_and_version() -> None:
    defines = iss_defines()
    assert defines["AppName"] == cfg.APP_NAME
    assert defines["AppVersion"] == cfg.project_version()
    assert defines["AppExeName"] == f"{cfg.EXE_NAME}.exe"
    assert defines["AppPublisher"] == cfg.PUBLISHER


def test_iss_has_start_menu_entry_uninstaller_and_icon() -> None:
    text = ISS.read_text(encoding="utf-8")
    sections = set(re.findall(r"^\[(\w+)\]", text, re.M))
    assert {"Setup", "Files", "Icons", "Run"} <= sections
    assert re.search(r'^Name: "\{group\}\\\{#AppName\}"; Filename: "\{app\}\\\{#AppExeName\}"',
                     text, re.M), "no Start-menu entry for the app"
    assert "{uninstallexe}" in text, "no Start-menu entry for the uninstaller"
    assert f"{cfg.CLI_EXE_NAME}.exe" in text
    icon = re.search(r"^SetupIconFile=(.+)$", text, re.M)
    assert icon is not None
    assert (ISS.parent / icon.group(1).strip().replace("\\", "/")).resolve() == \
        (ICONS / "app.ico").resolve()
    app_id = re.search(r"^AppId=\{\{([0-9A-F-]{36})\}", text, re.M)
    assert app_id is not None, "AppId must be a fixed GUID (upgrades and the uninstaller)"


def test_iss_mentions_the_directml_build() -> None:
    assert "directml" in ISS.read_text(encoding="utf-8")
    assert cfg.expected_ort_variant("win32") == "onnxruntime-directml"


# --- the spec and the bundle's contents ---------------------------------------------------

def test_spec_never_strips_and_uses_the_launcher() -> None:
    text = SPEC.read_text(encoding="utf-8")
    assert "strip=True" not in text and "--strip" not in text.replace("never `--strip`", "")
    assert text.count("strip=False") >= 2
    assert "launcher.py" in text and (INSTALLER / "launcher.py").is_file()
    assert "collect_dynamic_libs(\"onnxruntime\")" in text
    assert "copy_metadata(variant)" in text  # engine.runtime reads the variant's metadata
    ast.parse(text)  # it is Python


def test_launcher_dispatches_to_the_app_main() -> None:
    tree = ast.parse((INSTALLER / "launcher.py").read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert any(n.module == "app.__main__" for n in imports)


def runtime_imports() -> set[str]:
    """Top-level modules that engine/ and app/ import (at module level or in functions)."""
    names: set[str] = set()
    for folder in ("engine", "app"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module)
    return names


def test_excludes_spare_everything_the_app_imports() -> None:
    imported = runtime_imports()
    for excluded in cfg.EXCLUDES:
        clash = [m for m in imported if m == excluded or m.startswith(excluded + ".")]
        assert not clash, f"{excluded} is excluded from the bundle but imported: {clash}"
    assert "onnx" in cfg.EXCLUDES  # the engine reads ONNX files itself (engine.onnx_scan)


def test_hidden_imports_name_real_modules() -> None:
    import importlib.util

    for name in cfg.HIDDEN_IMPORTS:
        if name == "pynvml":  # the cuda extra
            continue
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.parametrize(("dest", "kept"), [
    ("PySide6/Qt/plugins/platforms/libqxcb.so", True),
    ("PySide6/Qt/plugins/platforms/libqoffscreen.so", True),
    ("PySide6/Qt/plugins/platforms/libqwayland.so", True),
    ("PySide6/Qt/plugins/platforms/libqvnc.so", False),
    ("PySide6/Qt/plugins/platforms/libqeglfs.so", False),
    ("PySide6/plugins/platforms/qwindows.dll", True),
    ("PySide6/Qt/plugins/imageformats/libqpdf.so", False),
    ("PySide6/Qt/plugins/imageformats/libqsvg.so", True),
    ("PySide6/Qt/plugins/platformthemes/libqgtk3.so", False),
    ("PySide6/Qt/plugins/platforminputcontexts/libqtvirtualkeyboardplugin.so", False),
    ("PySide6/Qt/plugins/sqldrivers/libqsqlite.so", False),
    ("PySide6/Qt/plugins/tls/libqopensslbackend.so", True),
    ("PySide6/Qt/translations/qtbase_de.qm", False),
    ("PySide6/Qt/lib/libQt6Charts.so.6", True),
    ("PySide6/Qt/lib/libQt6Network.so.6", True),
    ("PySide6/Qt/lib/libQt6Pdf.so.6", False),
    ("PySide6/Qt6WebEngineCore.dll", False),
    ("onnxruntime/capi/libonnxruntime_providers_shared.so", True),
])
def test_qt_file_filter(dest: str, kept: bool) -> None:
    assert cfg.keep_qt_file(dest) is kept


def test_resource_junk_filter() -> None:
    assert cfg.is_resource_junk("resources/models/__pycache__/x.pyc")
    assert not cfg.is_resource_junk("resources/models/smollm2-135m-instruct/model.onnx")


# --- the build script ---------------------------------------------------------------------

def test_version_is_read_from_pyproject() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{cfg.project_version()}"' in text


@pytest.mark.parametrize(("platform", "cuda", "expected"), [
    ("linux", False, "onnxruntime"), ("linux", True, "onnxruntime-gpu"),
    ("win32", False, "onnxruntime-directml"), ("win32", True, "onnxruntime-directml"),
    ("darwin", False, "onnxruntime"),
])
def test_expected_variant_per_platform(platform: str, cuda: bool, expected: str) -> None:
    assert cfg.expected_ort_variant(platform, cuda) == expected
    assert check_variant(cuda, [expected], platform) == expected


def test_variant_check_refuses_the_wrong_or_several_variants() -> None:
    with pytest.raises(BuildError, match="exactly 'onnxruntime-gpu'.*found: onnxruntime\\."):
        check_variant(True, ["onnxruntime"], "linux")
    with pytest.raises(BuildError, match="found: onnxruntime, onnxruntime-gpu"):
        check_variant(False, ["onnxruntime", "onnxruntime-gpu"], "linux")
    with pytest.raises(BuildError, match="found: no ONNX Runtime.*directml,app,package"):
        check_variant(False, [], "win32")
    with pytest.raises(ValueError, match="macOS"):
        cfg.expected_ort_variant("darwin", cuda=True)


def test_build_refuses_a_wrong_variant_with_a_clear_message() -> None:
    """The real script, end to end: on this (CPU) venv a --cuda build must stop at once."""
    if cfg.expected_ort_variant(sys.platform, cuda=True) == "onnxruntime-directml":
        pytest.skip("Windows builds always take directml")
    installed = [v for v in cfg.ORT_VARIANTS if _installed(v)]
    if installed == ["onnxruntime-gpu"]:
        pytest.skip("this environment has onnxruntime-gpu: --cuda is the right build here")
    done = subprocess.run([sys.executable, str(INSTALLER / "build.py"), "--cuda"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1
    assert "error: this build needs exactly 'onnxruntime-gpu' installed" in done.stderr


def _installed(dist: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_build_wrapper_and_makefile() -> None:
    wrapper = INSTALLER / "build"
    assert os.access(wrapper, os.X_OK)
    assert "installer/build.py" in wrapper.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^package:", makefile, re.M)
    assert re.search(r"^package-test:", makefile, re.M)
    assert "PACKAGE_TEST=1" in makefile


def test_pyproject_offers_the_package_extra() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^package = \["pyinstaller>=6"\]', text, re.M)


def test_docs_cover_install_first_run_and_troubleshooting() -> None:
    text = (ROOT / "docs" / "INSTALL.md").read_text(encoding="utf-8")
    for needle in ("tar.gz", "AppImage", "Windows", "macOS", "--selftest", "Editors",
                   "Troubleshooting", "port", "out of memory", "settings.ini"):
        assert needle.lower() in text.lower(), needle
    macos = (INSTALLER / "macos" / "README.md").read_text(encoding="utf-8")
    for needle in ("codesign", "notarytool", "CoreML", "onnx-local-llm.spec"):
        assert needle in macos
