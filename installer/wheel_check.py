"""CI step: the wheel works end to end in a fresh virtual environment outside the checkout.

1. builds the wheel (``pip wheel --no-deps``) from a copy of the checkout's files (tracked
   and new, not ignored ones), so nothing a developer built in place gets in;
2. installs ``WHEEL[cpu]`` (the headless install: the engine and its worker, no Qt) into a
   new venv in a temporary folder, starts ``python -m engine serve`` on a free loopback port
   and gets a chat answer from ``/v1/chat/completions`` (the built-in model);
3. checks that ``python -m app`` there says to install the app extra;
4. adds ``WHEEL[cpu,app]`` and runs ``python -m app --selftest``: ``"ok": true`` and the
   built-in model found under the venv's site-packages.

Every command runs in the temporary folder with its own HOME, so the checkout is not on the
path and nothing is written in the user's folders. Usage::

    python installer/wheel_check.py [--wheel dist/onnx_local_llm-*.whl] [--dist dist]

``--dist`` also keeps the built wheel there; ``--wheel`` checks a wheel built before.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A sane size for the wheel: the built-in model (86 MB, ~75 MB compressed) and the code.
WHEEL_MB = (60, 110)


def log(text: str) -> None:
    print(f"wheel_check: {text}", flush=True)


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 1800,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise SystemExit(f"wheel_check: {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


#: Left out of the copy where the checkout is no git repository (what .gitignore ignores).
NOT_SOURCE = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache",
              ".pytest_cache", ".hypothesis"}


def checkout_files() -> list[str]:
    """The tracked and new files (what .gitignore ignores stays out, built kernels too)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # an unpacked source archive
        return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                if p.is_file() and not NOT_SOURCE & set(p.relative_to(ROOT).parts)
                and not p.name.endswith((".ortops", ".pyc")) and ".egg-info" not in str(p)]
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def build_wheel(work: Path, env: dict[str, str]) -> Path:
    source = work / "source"
    for name in checkout_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    out = work / "wheel"
    started = time.monotonic()
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
         str(source)], env, work)
    (wheel,) = out.glob("*.whl")
    log(f"built {wheel.name} in {time.monotonic() - started:.0f} s")
    return wheel


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def chat_through_worker(python: Path, env: dict[str, str], cwd: Path) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    worker = subprocess.Popen([str(python), "-m", "engine", "serve", "--port", str(port)],
                              env=env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if worker.poll() is not None:
                raise SystemExit(f"wheel_check: the worker exited ({worker.returncode}):\n"
                                 f"{worker.stdout.read() if worker.stdout else ''}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit("wheel_check: the worker was not ready in 300 s")
            time.sleep(0.5)
        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16,
                "temperature": 0}
        request = urllib.request.Request(url + "/v1/chat/completions",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer = json.loads(reply.read())
        text = str(answer["choices"][0]["message"]["content"])
        if not text.strip():
            raise SystemExit(f"wheel_check: an empty chat answer: {answer}")
        return text
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="check this wheel instead of building one")
    parser.add_argument("--dist", type=Path, help="also keep the built wheel in this folder")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="onnx-local-llm-wheel-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        # the checkout is not on the path; pip's cache stays where the user keeps it
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
        env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                    "XDG_DATA_HOME": str(home / ".local" / "share"),
                    "XDG_STATE_HOME": str(home / ".local" / "state"),
                    "XDG_CACHE_HOME": str(home / ".cache"), "PIP_CACHE_DIR": cache,
                    "ONNX_LOCAL_LLM_HOME": str(home / "app"), "HF_HUB_OFFLINE": "1",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "QT_QPA_PLATFORM": "offscreen"})
        wheel = args.wheel.resolve() if args.wheel else build_wheel(work, env)
        size_mb = wheel.stat().st_size / 1e6
        log(f"{wheel.name}: {size_mb:.1f} MB")
        if not WHEEL_MB[0] <= size_mb <= WHEEL_MB[1]:
            raise SystemExit(f"wheel_check: {size_mb:.1f} MB is outside {WHEEL_MB} MB: the "
                             "built-in model is missing, or something else got in")
        if args.dist and not args.wheel:
            args.dist.mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheel, args.dist / wheel.name)

        venv = work / "venv"
        run([sys.executable, "-m", "venv", str(venv)], env, work)
        python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        step = time.monotonic()
        run([str(python), "-m", "pip", "install", "-q", f"{wheel}[cpu]"], env, work)
        log(f"installed [cpu] (headless) in {time.monotonic() - step:.0f} s")
        qt = run([str(python), "-c", "import importlib.util as u; "
                  "print(u.find_spec('PySide6') is not None)"], env, work).stdout.strip()
        if qt != "False":
            raise SystemExit("wheel_check: the headless install brought PySide6")

        text = chat_through_worker(python, env, work)
        log(f"python -m engine serve answered a chat: {text[:60]!r}")

        app = run([str(python), "-m", "app"], env, work, check=False)
        if app.returncode == 0 or "onnx-local-llm[cpu,app]" not in app.stderr:
            raise SystemExit(f"wheel_check: python -m app without Qt said:\n{app.stderr}")
        log("python -m app without Qt names the app extra")

        step = time.monotonic()
        run([str(python), "-m", "pip", "install", "-q", f"{wheel}[cpu,app]"], env, work)
        log(f"installed [cpu,app] in {time.monotonic() - step:.0f} s")
        done = run([str(python), "-m", "app", "--selftest"], env, work, check=False)
        report = json.loads(done.stdout)
        site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                    "['purelib'])"], env, work).stdout.strip()
        model_dir = str(report.get("model_dir"))
        log(f"python -m app --selftest: ok={report.get('ok')}, model_dir={model_dir}")
        inside = Path(model_dir).resolve().is_relative_to(Path(site).resolve())
        if not report.get("ok") or not inside:
            raise SystemExit(f"wheel_check: the self-test failed or found its model outside "
                             f"{site}:\n{done.stdout}\n{done.stderr[-4000:]}")
    log(f"all good in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
