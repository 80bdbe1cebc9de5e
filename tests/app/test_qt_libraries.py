"""The window's system libraries: a missing one is named with the package that installs it,
and the app says so instead of letting Qt abort."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import qt_libraries
from app.__main__ import main
from tests.app.conftest import ROOT


def _shared_object(folder: Path, name: str, soname: str | None = None,
                   needs: tuple[str, ...] = ()) -> Path:
    """An empty ELF shared object linking ``needs`` (built with binutils' as and ld)."""
    if not (shutil.which("as") and shutil.which("ld")):
        pytest.skip("binutils (as, ld) is not installed: apt-get install binutils")
    empty = folder / "empty.o"
    if not empty.exists():
        subprocess.run(["as", "-o", str(empty), "/dev/null"], check=True)
    args = ["ld", "-shared", "-o", str(folder / name), str(empty), "-L", str(folder)]
    if soname:
        args += ["-soname", soname]
    for lib in needs:
        args.append(f"-l:{lib}")
    subprocess.run(args, check=True, capture_output=True)
    return folder / name


#: Stand-ins for libxcb-icccm.so.4 and libxcb-keysyms.so.1 (which this machine may have):
#: names no system has, known to the list as those two packages' libraries.
STAND_INS = {"libstand-in-icccm.so.4": "libxcb-icccm4", "libstand-in-keysyms.so.1":
             "libxcb-keysyms1"}


@pytest.fixture
def plugin_missing_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for Qt's xcb plugin that links two libraries of known packages and one no
    package is known for, none of which the loader finds (as on a fresh Debian 12)."""
    for soname, package in STAND_INS.items():
        monkeypatch.setitem(qt_libraries.LIBRARIES, soname, package)
    needs = (*STAND_INS, "libnot-a-package.so.3")
    for lib in needs:
        _shared_object(tmp_path, lib, soname=lib)
    plugin = _shared_object(tmp_path, "libqxcb.so", needs=needs)
    for lib in needs:
        (tmp_path / lib).unlink()
    return plugin


def test_missing_libraries_are_found_and_named_with_their_packages(plugin_missing_libraries):
    missing = qt_libraries.missing_libraries(plugin_missing_libraries)
    assert missing == [*STAND_INS, "libnot-a-package.so.3"]
    assert qt_libraries.packages_for(missing) == (["libxcb-icccm4", "libxcb-keysyms1"],
                                                  ["libnot-a-package.so.3"])


def test_the_app_names_the_missing_libraries_and_the_command_instead_of_opening(
        plugin_missing_libraries, monkeypatch, capsys):
    import app.launch

    def no_window(_args):
        raise AssertionError("the app went on to open its window")

    monkeypatch.setattr(qt_libraries, "xcb_plugin", lambda: plugin_missing_libraries)
    monkeypatch.setattr(app.launch, "run_gui", no_window)
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert main(["--no-welcome"]) == 1
    err = capsys.readouterr().err
    assert "needs system libraries that are not installed: libstand-in-icccm.so.4, " \
        "libstand-in-keysyms.so.1, libnot-a-package.so.3" in err
    assert "apt-get install -y --no-install-recommends libxcb-icccm4 libxcb-keysyms1\n" in err
    assert "the packages that provide libnot-a-package.so.3" in err
    assert "libxcb-cursor0" not in err  # Qt's own message blames that one, whatever is missing


def test_the_real_plugin_is_found_and_a_complete_system_has_nothing_missing():
    plugin = qt_libraries.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    missing = qt_libraries.missing_libraries(plugin)
    # whatever this machine lacks, each missing library has a known package
    assert qt_libraries.packages_for(missing)[1] == []


@pytest.mark.parametrize(("environ", "xcb"), [
    ({}, True), ({"QT_QPA_PLATFORM": "xcb"}, True), ({"QT_QPA_PLATFORM": "offscreen"}, False),
    ({"QT_QPA_PLATFORM": "wayland"}, False),
    ({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}, False),
    ({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "x11"}, True),
])
def test_only_a_window_on_x11_is_checked(environ, xcb):
    assert qt_libraries.uses_xcb(environ) is xcb


def test_the_package_list_runs_on_the_system_python_before_any_venv():
    """.ci/run and scripts/setup call it with python3 before .venv exists: no import from
    outside the standard library."""
    done = subprocess.run([sys.executable, "-S", "-m", "app.qt_libraries", "--all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert {"libxcb-icccm4", "libxcb-keysyms1", "libxcb-cursor0", "fonts-dejavu-core"} \
        <= set(names)
    assert len(names) == len(set(names))
