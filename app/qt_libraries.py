"""The system libraries Qt needs to open a window on Linux, which of them are missing, and
the command that installs them.

PySide6's wheels carry Qt itself but not the X11 (xcb), OpenGL, font and GLib libraries
of the system; a bare Debian or Ubuntu lacks some of them (libxcb-icccm4 and
libxcb-keysyms1 on a fresh Debian 12). Qt then aborts with a message that names
libxcb-cursor0 whatever is missing. The truth is in the dependencies of Qt's xcb platform
plugin (``ldd``), which this module reads.

One list for everything that installs them: ``scripts/setup`` (the README's first
command), ``.ci/run`` and the app's own start-up check. Standard library only, so the
system's ``python3`` runs it before the app's venv exists::

    python3 -m app.qt_libraries --all       # every package the window needs, one line
    python3 -m app.qt_libraries --missing   # the packages whose libraries are missing
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: The shared libraries of the system that Qt's xcb platform plugin (and Qt's GUI
#: libraries under it) links, each with the Debian / Ubuntu package that installs it.
#: Names as in Debian 12; apt takes them on Ubuntu 24.04 and Debian 13 too, where some
#: packages gained a ``t64`` suffix and still provide the old name.
LIBRARIES: dict[str, str] = {
    "libGL.so.1": "libgl1",
    "libGLX.so.0": "libglx0",
    "libGLdispatch.so.0": "libglvnd0",
    "libEGL.so.1": "libegl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libXau.so.6": "libxau6",
    "libXdmcp.so.6": "libxdmcp6",
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libpng16.so.16": "libpng16-16",
}
#: Linked by no plugin, needed all the same: with no font at all Qt draws empty boxes.
FONTS = "fonts-dejavu-core"
XCB_PLUGIN = "libqxcb.so"


def packages() -> list[str]:
    """Every package the window needs (what ``.ci/run`` installs), in a stable order."""
    return sorted(set(LIBRARIES.values())) + [FONTS]


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin (None when PySide6 or the plugin is not there)."""
    try:
        spec = importlib.util.find_spec("PySide6")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for plugins in (Path(folder) / "Qt" / "plugins", Path(folder) / "plugins"):
            plugin = plugins / "platforms" / XCB_PLUGIN
            if plugin.is_file():
                return plugin
    return None


def missing_libraries(plugin: Path) -> list[str]:
    """The libraries ``plugin`` needs (directly or through others) that the dynamic loader
    does not find: from ``ldd`` when there is one, else from a trial load (which names only
    the first)."""
    ldd = shutil.which("ldd")
    if ldd:
        done = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=30,
                              check=False)
        found = re.findall(r"^\s*(\S+)\s+=>\s+not found", done.stdout, re.M)
        return list(dict.fromkeys(found))
    import ctypes

    try:
        ctypes.CDLL(str(plugin))
    except OSError as exc:
        name = re.match(r"(\S+?): cannot open shared object file", str(exc))
        return [name.group(1)] if name else [str(exc)]
    return []


def packages_for(libraries: Sequence[str]) -> tuple[list[str], list[str]]:
    """The packages that install ``libraries``, and the libraries no package is known for."""
    known = [LIBRARIES[name] for name in libraries if name in LIBRARIES]
    unknown = [name for name in libraries if name not in LIBRARIES]
    return list(dict.fromkeys(known)), unknown


def install_command(names: Sequence[str]) -> str:
    """The exact command that installs ``names`` (``sudo`` unless this is root)."""
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get install -y --no-install-recommends {' '.join(names)}"


def uses_xcb(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether Qt would open its window with the xcb plugin: on Linux, unless another
    platform is asked for (``QT_QPA_PLATFORM``) or this is a Wayland session."""
    if not sys.platform.startswith("linux"):
        return False
    asked = environ.get("QT_QPA_PLATFORM", "")
    if asked:
        return asked.split(";")[0].split(":")[0] == "xcb"
    wayland = environ.get("WAYLAND_DISPLAY") and environ.get("XDG_SESSION_TYPE") == "wayland"
    return not wayland


def display_problem(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """What keeps Qt from opening a window here, in words a user can act on (None: nothing
    this check can see). The app prints it instead of letting Qt abort."""
    if not uses_xcb(environ):
        return None
    plugin = xcb_plugin()
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    names, unknown = packages_for(missing)
    lines = [
        "error: the window cannot open: Qt's X11 platform plugin (xcb) needs system "
        f"libraries that are not installed: {', '.join(missing)}",
    ]
    if names:
        lines.append(f"fix: install them with:  {install_command(names)}")
    if unknown:
        lines.append(f"fix: and install the packages that provide {', '.join(unknown)}")
    lines.append("(in a source checkout ./scripts/setup installs them; on a Wayland desktop "
                 "QT_QPA_PLATFORM=wayland also works)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m app.qt_libraries",
        description="The system packages Qt needs to open the app's window on Debian or "
        "Ubuntu.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--all", action="store_true",
                      help="print every package, on one line")
    what.add_argument("--missing", action="store_true",
                      help="print the packages whose libraries the xcb plugin does not find "
                      "(nothing when none; exit 1 when some library has no known package)")
    args = parser.parse_args(argv)
    if args.all:
        print(" ".join(packages()))
        return 0
    plugin = xcb_plugin()
    if plugin is None:
        print("error: PySide6's xcb platform plugin was not found: install the app first",
              file=sys.stderr)
        return 2
    names, unknown = packages_for(missing_libraries(plugin))
    if names:
        print(" ".join(names))
    if unknown:
        print(f"error: no known package provides {', '.join(unknown)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
