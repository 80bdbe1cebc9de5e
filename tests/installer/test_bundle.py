"""The built bundle, run as a user would: ``<exe> --selftest`` headless and offline, the
worker as ``<exe> --worker serve``, and the window (offscreen) with its worker.

Slow, and skipped unless ``PACKAGE_TEST=1`` is set or a bundle exists in dist/
(``make package-test`` builds one and runs this). Without the default model in the
bundle (resources/models/smollm2-135m-instruct), the self-test loads a forged model instead.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType

from engine.model.default_model import DEFAULT_MODEL_NAME
from installer import bundle_config as cfg

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = Path(os.environ.get("PACKAGE_BUNDLE", ROOT / "dist" / cfg.EXE_NAME))
_SUFFIX = ".exe" if sys.platform == "win32" else ""
EXE = BUNDLE / (cfg.EXE_NAME + _SUFFIX)
CLI_EXE = BUNDLE / ((cfg.CLI_EXE_NAME if sys.platform == "win32" else cfg.EXE_NAME) + _SUFFIX)
REPORT = ROOT / "dist" / "selftest-report.json"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PACKAGE_TEST") != "1" and not EXE.is_file(),
                       reason="no bundle in dist/ (make package-test builds one; or set "
                              "PACKAGE_TEST=1)"),
]


@pytest.fixture(scope="module")
def bundle() -> Path:
    if not EXE.is_file():
        pytest.fail(f"PACKAGE_TEST=1 but there is no bundle at {EXE}: run `make package`")
    return BUNDLE


def bundled_default_model(bundle: Path) -> Path | None:
    folder = bundle / "_internal" / "resources" / "models" / DEFAULT_MODEL_NAME
    return folder if (folder / "genai_config.json").is_file() else None


@pytest.fixture(scope="module")
def model_args(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """No argument when the bundle has its default model; else ``--model <forged>``."""
    if bundled_default_model(bundle) is not None:
        return []
    from tests.forge import ForgeSpec, write_genai_model

    folder = write_genai_model(tmp_path_factory.mktemp("bundle-model") / "forged", ForgeSpec())
    return ["--model", str(folder)]


def offline_prefix() -> tuple[list[str], str]:
    """A command prefix that runs a program in a network namespace with only loopback up,
    or [] and why that is not possible here."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not sys.platform.startswith("linux") or unshare is None:
        return [], "unshare is not available (util-linux, Linux only)"
    if ip is None:
        return [], "`ip` is missing (apt-get install -y iproute2)"
    probe = subprocess.run([unshare, "-n", "sh", "-c", f"{ip} link set lo up"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return [], f"unshare -n failed (needs root or user namespaces): {probe.stderr.strip()}"
    return [unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"], ""


def run_selftest(exe: Path, args: list[str], home: Path, prefix: list[str]
                 ) -> tuple[dict[str, Any], float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "ONNX_LOCAL_LLM_HOME": str(home)}
    env.pop("QT_QPA_PLATFORM", None)  # the self-test must not need a display or Qt at all
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    started = time.perf_counter()
    done = subprocess.run([*prefix, str(exe), "--selftest", "--timeout", "120", *args],
                          capture_output=True, text=True, env=env, timeout=240)
    total_s = time.perf_counter() - started
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON report (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                    f"{done.stderr[-3000:]}")
    return report, total_s, done


def check_report(report: dict[str, Any], done: subprocess.CompletedProcess[str]) -> None:
    assert report["ok"] is True, json.dumps(report, indent=2) + done.stderr[-2000:]
    assert done.returncode == 0
    assert report["frozen"] is True
    assert report["listens_on"] == "127.0.0.1"
    assert report["url"].startswith("http://127.0.0.1:")
    assert report["chat"]["text"].strip()
    assert report["fim"]["text"].strip()
    assert report["worker_exit_code"] == 0
    # how fast is a benchmark's question (launch-to-ready is saved in dist/selftest-report.json
    # and measured by bench.builtin_model), not a test's: here, that the worker got ready
    assert report["ready_s"] > 0


def save(name: str, report: dict[str, Any], total_s: float) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    saved: dict[str, Any] = json.loads(REPORT.read_text()) if REPORT.is_file() else {}
    saved[name] = {**report, "exe_to_report_s": round(total_s, 2)}
    REPORT.write_text(json.dumps(saved, indent=2), encoding="utf-8")
    print(f"\n{name}: ready_s={report.get('ready_s')} exe_to_report_s={total_s:.2f} "
          f"model={report.get('model')}")


def test_selftest_offline(bundle: Path, model_args: list[str], tmp_path: Path) -> None:
    """In a network namespace with only loopback: no download, no outside address."""
    prefix, why = offline_prefix()
    if not prefix:
        pytest.skip(f"cannot cut the network here: {why}")
    report, total_s, done = run_selftest(CLI_EXE, model_args, tmp_path / "home", prefix)
    check_report(report, done)
    save("offline", report, total_s)


def test_selftest(bundle: Path, model_args: list[str], tmp_path: Path) -> None:
    report, total_s, done = run_selftest(CLI_EXE, model_args, tmp_path / "home", [])
    check_report(report, done)
    if not model_args:
        assert report["model_dir"] == report["default_model"]
    save("plain", report, total_s)


def test_worker_mode_runs_the_engine_cli(bundle: Path, model_args: list[str]) -> None:
    """``<exe> --worker ...`` is the engine's command line (app/worker.py's command_for)."""
    model = model_args[1] if model_args else str(bundled_default_model(bundle))
    done = subprocess.run([str(CLI_EXE), "--worker", "inspect", model], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()


def test_the_packaged_app_imports_a_gguf_file(bundle: Path, tmp_path: Path) -> None:
    """Models → Import GGUF runs ``<exe> --worker import-gguf`` (app/gguf_sources.py): the
    bundle carries the gguf reader and writes a folder its own worker can inspect."""
    from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf

    gguf = write_gguf(tmp_path / "tiny.gguf", TinySpec("llama", GGMLQuantizationType.Q4_0),
                      tokenizer_source(tmp_path))
    out = tmp_path / "imported"
    done = subprocess.run([str(CLI_EXE), "--worker", "import-gguf", str(gguf), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "genai_config.json").is_file()
    shown = subprocess.run([str(CLI_EXE), "--worker", "inspect", str(out), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout)["format"] == "genai"


def test_bundle_is_lean(bundle: Path) -> None:
    internal = bundle / "_internal"
    for absent in ("torch", "onnx", "matplotlib", "tkinter", "pytest", "schemathesis",
                   "hypothesis", "onnxruntime_genai", "PySide6/Qt/translations"):
        assert not (internal / absent).exists(), f"{absent} is in the bundle"
    names = {p.name for p in internal.rglob("*")}
    assert not any(n.startswith(("libQt6WebEngine", "Qt6WebEngine", "libQt6Quick", "libQt63D",
                                 "libQt6Multimedia", "libQt6Pdf")) for n in names)
    for needed in ("onnxruntime", "tokenizers", "PySide6", "resources/icons/app.png"):
        assert (internal / needed).exists(), f"{needed} is missing"
    assert list(internal.glob("onnxruntime-*.dist-info")) \
        or list(internal.glob("onnxruntime_*.dist-info")), \
        "onnxruntime's metadata is missing (engine.runtime checks the variant with it)"
    platforms = {p.name for p in (internal / "PySide6").rglob("platforms/*")}
    if sys.platform.startswith("linux"):
        assert {"libqxcb.so", "libqoffscreen.so", "libqwayland.so"} <= platforms
    size_mib = sum(p.stat().st_size for p in bundle.rglob("*")
                   if p.is_file() and not p.is_symlink()) / 2**20  # as du counts
    print(f"\nbundle size: {size_mib:.0f} MiB")


class Gui:
    """The frozen app started offscreen; its stderr read on a thread (never blocks)."""

    def __init__(self, args: list[str], home: Path, platform: str) -> None:
        env = {**os.environ, "ONNX_LOCAL_LLM_HOME": str(home), "ONNX_LOCAL_LLM_TIMING": "1"}
        self.xvfb: subprocess.Popen[str] | None = None
        if platform == "xcb":  # a real X server (Xvfb): the plug-in users on X11 get
            self.xvfb = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0",
                                          "1280x800x24", "-nolisten", "tcp"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)
            assert self.xvfb.stdout is not None
            env["DISPLAY"] = ":" + self.xvfb.stdout.readline().strip()
            env.pop("QT_QPA_PLATFORM", None)
            env.pop("WAYLAND_DISPLAY", None)
        else:
            env["QT_QPA_PLATFORM"] = platform
        self.proc = subprocess.Popen([str(EXE), "--no-welcome", *args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, words: tuple[str, ...], timeout: float) -> str | None:
        """The first stderr line holding one of ``words`` (None: not within timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.25)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    return None
                continue
            self.seen.append(line)
            if any(word in line for word in words):
                return line
        return None

    def workers(self) -> list[Any]:
        import psutil

        try:
            return [c for c in psutil.Process(self.proc.pid).children(recursive=True)
                    if "--worker" in c.cmdline()]
        except psutil.Error:
            return []

    def close(self) -> list[int]:
        """Stop the app; end (and return the ids of) workers that outlived it."""
        import psutil

        children = self.workers()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        _, alive = psutil.wait_procs(children, timeout=10)
        for child in alive:
            child.kill()
        if self.xvfb is not None:
            self.xvfb.terminate()
            self.xvfb.wait(10)
        return [child.pid for child in alive]


@pytest.mark.parametrize("platform", ["offscreen", "xcb"])
def test_window_opens_and_starts_its_worker(bundle: Path, model_args: list[str],
                                            tmp_path: Path, platform: str) -> None:
    """The frozen GUI (Qt's platform plug-ins, QtCharts, QtNetwork) shows its window and
    starts ``<exe> --worker serve`` listening on 127.0.0.1 only."""
    psutil = pytest.importorskip("psutil")
    if platform == "xcb" and not (sys.platform.startswith("linux") and shutil.which("Xvfb")):
        pytest.skip("Xvfb is not installed (apt-get install xvfb)")
    gui = Gui(model_args, tmp_path / "home", platform)
    try:
        # app/launch.py with ONNX_LOCAL_LLM_TIMING: "window shown in N ms", or JSON events
        shown = gui.wait_for(("window shown", '"event": "shown"'), 60)
        assert shown, f"the window did not open (exit {gui.proc.poll()}): {gui.seen[-20:]}"
        deadline = time.monotonic() + 60
        listening: list[str] = []
        while time.monotonic() < deadline and not listening:
            assert gui.proc.poll() is None, f"the app exited: {gui.seen[-20:]}"
            for child in gui.workers():
                try:
                    assert Path(child.exe()).resolve() == EXE.resolve()
                    connections = getattr(child, "net_connections", child.connections)()
                    listening = [f"{c.laddr.ip}:{c.laddr.port}" for c in connections
                                 if c.status == psutil.CONN_LISTEN]
                except psutil.Error:
                    continue
            time.sleep(0.25)
        assert listening, "no worker listened within 60 s"
        assert all(address.startswith("127.0.0.1:") for address in listening), listening
    finally:
        orphans = gui.close()
    if orphans:  # the app's business (app/worker.py), not the bundle's: say it, don't fail
        print(f"\nnote: worker(s) {orphans} outlived the app after SIGTERM; ended by the test")


def test_tarball_unpacks_installs_and_runs(bundle: Path, model_args: list[str],
                                           tmp_path: Path) -> None:
    """The Linux .tar.gz: unpacked elsewhere, install.sh puts a valid menu entry, icons and
    a launcher under PREFIX, and the unpacked program passes its self-test."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the .tar.gz is the Linux package")
    tarballs = sorted((ROOT / "dist").glob(f"{cfg.EXE_NAME}-*-linux-*.tar.gz"))
    if not tarballs:
        pytest.skip("no .tar.gz in dist/ (installer/build --no-package was used)")
    import tarfile

    with tarfile.open(tarballs[-1]) as tar:
        if hasattr(tarfile, "tar_filter"):  # Python 3.10.12+/3.11.4+
            tar.extractall(tmp_path / "apps", filter="tar")
        else:
            tar.extractall(tmp_path / "apps")  # our own archive
    (top,) = (tmp_path / "apps").iterdir()
    prefix = tmp_path / "prefix"
    done = subprocess.run(["sh", str(top / "install.sh")], capture_output=True, text=True,
                          env={**os.environ, "PREFIX": str(prefix)}, timeout=60)
    assert done.returncode == 0, done.stderr
    desktop = prefix / "share" / "applications" / f"{cfg.EXE_NAME}.desktop"
    text = desktop.read_text(encoding="utf-8")
    assert f'Exec="{top}/{cfg.EXE_NAME}/{cfg.EXE_NAME}" %U' in text
    if shutil.which("desktop-file-validate"):
        check = subprocess.run(["desktop-file-validate", str(desktop)], capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    assert (prefix / "share/icons/hicolor/256x256/apps" / f"{cfg.EXE_NAME}.png").is_file()
    assert (prefix / "share/icons/hicolor/scalable/apps" / f"{cfg.EXE_NAME}.svg").is_file()
    launcher = prefix / "bin" / cfg.EXE_NAME
    report, total_s, done = run_selftest(launcher, model_args, tmp_path / "home", [])
    check_report(report, done)
    save("from_tarball", report, total_s)
    done = subprocess.run(["sh", str(top / "install.sh"), "--uninstall"], capture_output=True,
                          text=True, env={**os.environ, "PREFIX": str(prefix)}, timeout=60)
    assert done.returncode == 0 and not desktop.exists() and not launcher.exists()
