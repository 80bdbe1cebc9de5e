"""Build the app bundle and its platform package: ``installer/build [--cuda] ...``.

1. checks that exactly the expected ONNX Runtime variant is installed (cpu on Linux and
   macOS, ``--cuda`` for onnxruntime-gpu, directml on Windows),
2. runs PyInstaller on installer/onnx-local-llm.spec -> dist/onnx-local-llm/ (one folder),
3. smoke-tests the bundle (``--worker serve --help`` through the frozen executable),
4. packages it: Linux .tar.gz (+ AppImage when appimagetool is on PATH), Windows
   Inno Setup installer (when iscc is on PATH), macOS .app (from the spec),
5. prints the bundle size.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python installer/build.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from installer import bundle_config as cfg

ROOT = cfg.ROOT
SPEC = ROOT / "installer" / "onnx-local-llm.spec"
LINUX = ROOT / "installer" / "linux"
ISS = ROOT / "installer" / "windows" / "onnx-local-llm.iss"


class BuildError(RuntimeError):
    """A precondition or a step failed; the message says how to fix it."""


def installed_variants() -> list[str]:
    found = []
    for name in cfg.ORT_VARIANTS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_variant(cuda: bool, found: list[str] | None = None,
                  platform_name: str = sys.platform) -> str:
    """The one installed onnxruntime variant, when it is the one this build wants."""
    expected = cfg.expected_ort_variant(platform_name, cuda)
    found = installed_variants() if found is None else found
    extra = {"onnxruntime": "cpu", "onnxruntime-gpu": "cuda",
             "onnxruntime-directml": "directml"}[expected]
    fix = (f"pip uninstall -y {' '.join(found) or 'onnxruntime'} && "
           f"pip install -e '.[{extra},app,package]'")
    if found != [expected]:
        what = ", ".join(found) if found else "no ONNX Runtime"
        raise BuildError(f"this build needs exactly '{expected}' installed, found: {what}. "
                         f"Fix: {fix}")
    return expected


def run_pyinstaller(dist: Path, work: Path, variant: str, clean: bool) -> Path:
    if importlib.util.find_spec("PyInstaller") is None:
        raise BuildError("PyInstaller is not installed. Fix: pip install -e '.[package]' "
                         "(or pip install 'pyinstaller>=6')")
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
           "--distpath", str(dist), "--workpath", str(work), str(SPEC)]
    if clean:
        cmd.insert(3, "--clean")
    env = {**os.environ, "ONNX_LOCAL_LLM_ORT_VARIANT": variant}
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        raise BuildError("PyInstaller failed (its messages are above)")
    bundle = dist / cfg.EXE_NAME
    if not executable(bundle).is_file():
        raise BuildError(f"PyInstaller finished but {executable(bundle)} is missing")
    return bundle


def executable(bundle: Path, cli: bool = False) -> Path:
    name = cfg.CLI_EXE_NAME if cli and sys.platform == "win32" else cfg.EXE_NAME
    return bundle / (name + (".exe" if sys.platform == "win32" else ""))


def smoke_test(bundle: Path) -> None:
    """The frozen executable reaches the engine's CLI in worker mode."""
    exe = executable(bundle, cli=True)
    done = subprocess.run([str(exe), "--worker", "serve", "--help"], capture_output=True,
                          text=True, timeout=120, env={**os.environ,
                                                       "QT_QPA_PLATFORM": "offscreen"})
    if done.returncode != 0 or "--model" not in done.stdout:
        raise BuildError(f"the bundle's worker mode does not start ({exe} --worker serve "
                         f"--help, exit {done.returncode}):\n{done.stderr[-2000:]}")


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def machine() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def package_linux(bundle: Path, dist: Path, version: str) -> Path:
    """dist/onnx-local-llm-VERSION-linux-ARCH.tar.gz: the bundle, a .desktop entry, the
    icons and install.sh (menu entry + launcher for the current user)."""
    top = f"{cfg.EXE_NAME}-{version}"
    out = dist / f"{top}-linux-{machine()}.tar.gz"
    icons = ROOT / "resources" / "icons"
    print(f"packing {out.name} ...", flush=True)
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        tar.add(bundle, arcname=f"{top}/{cfg.EXE_NAME}")
        tar.add(LINUX / f"{cfg.EXE_NAME}.desktop", arcname=f"{top}/{cfg.EXE_NAME}.desktop")
        tar.add(LINUX / "install.sh", arcname=f"{top}/install.sh")
        for icon in sorted(icons.glob("app*.png")) + [icons / "app.svg"]:
            tar.add(icon, arcname=f"{top}/icons/{icon.name}")
        tar.add(ROOT / "docs" / "INSTALL.md", arcname=f"{top}/INSTALL.md")
    return out


def package_appimage(bundle: Path, dist: Path, version: str) -> Path | None:
    """An AppImage, when appimagetool is on PATH (it is in no package registry)."""
    tool = shutil.which("appimagetool")
    if tool is None:
        print("appimagetool is not on PATH: no AppImage (the .tar.gz is the Linux package; "
              "see docs/INSTALL.md)", flush=True)
        return None
    appdir = dist / f"{cfg.EXE_NAME}.AppDir"
    shutil.rmtree(appdir, ignore_errors=True)
    shutil.copytree(bundle, appdir / cfg.EXE_NAME, symlinks=True)
    shutil.copy2(LINUX / "AppRun", appdir / "AppRun")
    shutil.copy2(LINUX / f"{cfg.EXE_NAME}.desktop", appdir / f"{cfg.EXE_NAME}.desktop")
    shutil.copy2(ROOT / "resources" / "icons" / "app-256.png", appdir / f"{cfg.EXE_NAME}.png")
    out = dist / f"{cfg.EXE_NAME}-{version}-{machine()}.AppImage"
    env = {**os.environ, "ARCH": machine()}
    if subprocess.run([tool, str(appdir), str(out)], env=env).returncode != 0:
        raise BuildError("appimagetool failed (its messages are above)")
    return out


def package_windows(dist: Path, version: str) -> Path | None:
    iscc = shutil.which("iscc") or shutil.which("ISCC")
    if iscc is None:
        print("iscc (Inno Setup 6) is not on PATH: no installer; run "
              f'iscc /DAppVersion={version} "{ISS}" by hand', flush=True)
        return None
    cmd = [iscc, f"/DAppVersion={version}", f"/DDistDir={dist}", str(ISS)]
    if subprocess.run(cmd, cwd=ISS.parent).returncode != 0:
        raise BuildError("Inno Setup failed (its messages are above)")
    return dist / f"{cfg.EXE_NAME}-{version}-setup.exe"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="installer/build", description=__doc__.split("\n")[0])
    parser.add_argument("--cuda", action="store_true",
                        help="Linux/Windows: build with onnxruntime-gpu (NVIDIA CUDA)")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller",
                        help="PyInstaller's work folder")
    parser.add_argument("--clean", action="store_true", help="empty PyInstaller's cache first")
    parser.add_argument("--no-package", action="store_true",
                        help="the bundle only (no .tar.gz / AppImage / installer)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        variant = check_variant(args.cuda)
        print(f"ONNX Runtime: {variant} {importlib.metadata.version(variant)}", flush=True)
        version = cfg.project_version()
        bundle = run_pyinstaller(args.dist.resolve(), args.work.resolve(), variant, args.clean)
        smoke_test(bundle)
        packages: list[Path | None] = []
        if not args.no_package:
            if sys.platform.startswith("linux"):
                packages += [package_linux(bundle, args.dist, version),
                             package_appimage(bundle, args.dist, version)]
            elif sys.platform == "win32":
                packages.append(package_windows(args.dist, version))
            elif sys.platform == "darwin":
                packages.append(args.dist / f"{cfg.APP_NAME}.app")
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"bundle: {bundle} ({size_of(bundle) / 2**20:.0f} MiB)")
    for package in packages:
        if package is not None and package.exists():
            size = size_of(package) if package.is_dir() else package.stat().st_size
            print(f"package: {package} ({size / 2**20:.0f} MiB)")
    print(f"built in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
