"""Start, watch and restart the worker process (``python -m engine serve``).

The worker prints one JSON ready line on stdout once its socket listens (and the model,
when one is given, has loaded); everything else goes to stderr, of which the last lines
are kept to explain a crash. When the worker dies unexpectedly the app is told why, in
plain words, and a new worker starts (with the model that was loaded) after a short
back-off; if it keeps dying it is left stopped with the reason shown. In the frozen app
the worker is the app's own executable started with ``--worker``.
"""

from __future__ import annotations

import collections
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from app.paths import engine_command

#: Back-off before a restart after n failed starts in a row (seconds): a worker that was
#: serving is restarted at once.
BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0)
#: A worker that dies this many times in a row before its ready line (a bad model, a taken
#: port) is not started again until the user asks.
MAX_START_FAILURES = 5
STDERR_LINES = 40
#: How long a stopping worker may take to finish (after SIGTERM) before it is killed.
#: Nothing is lost by the kill: the app writes every message to its store as it comes.
STOP_WAIT_MS = 5000


#: The worker reads its API key from this variable (``python -m engine serve --help``).
API_KEY_ENV = "ONNX_LOCAL_LLM_API_KEY"


@dataclass(frozen=True)
class WorkerOptions:
    """How to start the worker (from the settings)."""

    model: str | None = None
    models_dirs: tuple[str, ...] = ()
    provider: str = "auto"
    port: int = 0
    api_key: str | None = None
    threads: int = 0
    #: False: the worker's threads never spin (`--spin-us 0`), for an always-busy machine
    threads_stay_awake: bool = True
    #: the KV's element type (`--kv-dtype`): auto, float16, int16 or int8
    kv_dtype: str = "auto"
    host_ram_limit: str = "auto"
    vram_limit: str = "auto"
    admin_token_file: str | None = None
    kv_store_dir: str | None = None
    #: the user's sampling presets per model (presets.json in the app's config folder)
    presets: str | None = None
    #: the app's pid: the worker stops when the app is gone, however it ended
    parent_pid: int | None = field(default_factory=os.getpid)
    extra_args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        args = ["serve", "--port", str(self.port), "--provider", self.provider,
                "--host-ram-limit", self.host_ram_limit, "--vram-limit", self.vram_limit]
        if self.model:
            args += ["--model", self.model]
        for root in self.models_dirs:
            args += ["--models-dir", root]
        if self.threads > 0:
            args += ["--threads", str(self.threads)]
        if not self.threads_stay_awake:
            args += ["--spin-us", "0"]
        if self.kv_dtype != "auto":
            args += ["--kv-dtype", self.kv_dtype]
        if self.admin_token_file:
            args += ["--admin-token-file", self.admin_token_file]
        if self.kv_store_dir:
            args += ["--kv-store-dir", self.kv_store_dir]
        if self.presets:
            args += ["--presets", self.presets]
        if self.parent_pid:
            args += ["--parent-pid", str(self.parent_pid)]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str | None]:
        """Variables set (None: removed) in the worker's environment. The API key travels
        here, never on the command line, which every local user can read."""
        return {API_KEY_ENV: self.api_key or None}


@dataclass(frozen=True)
class ReadyInfo:
    url: str
    pid: int
    model: str | None
    admin_token: str | None
    started_s: float  # from start() to the ready line
    log_file: str | None = None  # the worker's log (None: stderr only)


@dataclass(frozen=True)
class Crash:
    exit_code: int
    stderr_tail: list[str] = field(default_factory=list)
    diagnosis: str = ""
    restarting: bool = True


def command_for(options: WorkerOptions) -> tuple[str, list[str]]:
    """The program and arguments that start a worker: the same executable in the frozen
    app, ``python -m engine`` from source."""
    return engine_command(options.argv())


def diagnose(exit_code: int, crashed: bool, stderr_tail: list[str]) -> str:
    """What probably happened, in words a user can act on."""
    text = "\n".join(stderr_tail).lower()
    if "memoryerror" in text or "bad_alloc" in text or "failed to allocate" in text \
            or "out of memory" in text:
        return ("The worker ran out of memory. Lower the memory limit, close other programs "
                "or choose a smaller (e.g. int4) model.")
    if exit_code in (-9, 137) or (crashed and exit_code == 9):
        return ("The worker was killed (by the system's out-of-memory killer or another "
                "program). If memory was short, lower the memory limit or choose a smaller "
                "model.")
    if ("cuda" in text or "cudnn" in text or "cublas" in text) and (
            "cannot open shared object" in text or "not found" in text or "libcu" in text):
        return ("A GPU runtime library is missing (CUDA/cuDNN). Install the NVIDIA runtime "
                "or choose the CPU provider in Settings.")
    if "address already in use" in text or "cannot listen" in text:
        return "The worker's port is taken. Choose another port in Settings (0 picks any)."
    if "error:" in text:  # the engine's own one-line error and fix
        lines = [ln for ln in stderr_tail if ln.startswith(("error:", "fix:"))]
        if lines:
            return " ".join(lines[-2:])
    how = "crashed" if crashed else f"stopped with exit code {exit_code}"
    return f"The worker {how}. The last lines it wrote are below."


class WorkerProcess(QObject):
    """One local worker; ``start`` it, it keeps itself running until ``stop``."""

    state_changed = Signal(str)  # starting | ready | restarting | stopping | stopped | failed
    ready = Signal(object)  # ReadyInfo
    died = Signal(object)  # Crash
    log_line = Signal(str)  # each stderr line

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.options = WorkerOptions()
        self.state = "stopped"
        self.info: ReadyInfo | None = None
        self._proc: QProcess | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._out = b""
        self._err = b""
        self._start_failures = 0
        self._started_at = 0.0
        self._restart = QTimer(self)
        self._restart.setSingleShot(True)
        self._restart.timeout.connect(self._launch)
        self._stopping: QProcess | None = None  # told to stop, not yet gone
        #: how the worker stopped last ended: its exit code (a clean stop: 0), None for
        #: a crash or a kill
        self.stopped_with: int | None = None
        self._kill = QTimer(self)
        self._kill.setSingleShot(True)
        self._kill.timeout.connect(self._kill_stopping)

    @property
    def pid(self) -> int | None:
        return self.info.pid if self.info else None

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    def start(self, options: WorkerOptions) -> None:
        """Start (or restart with new options)."""
        self.options = options
        self._start_failures = 0
        if self._proc is not None:
            self._shutdown(self._proc)
        self._set_state("starting")
        self._launch()

    def set_model(self, model: str | None) -> None:
        """The model a restarted worker loads (the one the user loaded last)."""
        self.options = WorkerOptions(**{**self.options.__dict__, "model": model})

    def set_limit(self, tier: str, value: str) -> None:
        """The memory limit a restarted worker starts with (the one the user set last)."""
        name = {"host_ram": "host_ram_limit", "vram": "vram_limit"}.get(tier)
        if name is not None:
            self.options = WorkerOptions(**{**self.options.__dict__, name: value})

    def _launch(self) -> None:
        program, args = command_for(self.options)
        proc = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        for name, value in self.options.environment().items():
            if value is None:
                env.remove(name)
            else:
                env.insert(name, value)
        proc.setProcessEnvironment(env)
        # bound methods, not lambdas with captured defaults: PySide6 mis-counts references
        # of values passed through such lambdas (a crash at exit); the slots ask sender().
        proc.readyReadStandardOutput.connect(self._stdout_ready)
        proc.readyReadStandardError.connect(self._stderr_ready)
        proc.finished.connect(self._finished)
        proc.errorOccurred.connect(self._error)
        self._proc, self.info = proc, None
        self._stderr.clear()
        self._out = self._err = b""
        self._started_at = time.monotonic()
        proc.start(program, args)

    def _sender(self) -> QProcess | None:
        sender = self.sender()
        return sender if isinstance(sender, QProcess) else None

    def _stdout_ready(self) -> None:
        if (proc := self._sender()) is not None:
            self._read_stdout(proc)

    def _stderr_ready(self) -> None:
        if (proc := self._sender()) is not None:
            self._read_stderr(proc)

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if (proc := self._sender()) is not None:
            self._on_finished(proc, code, status)

    def _error(self, error: QProcess.ProcessError) -> None:
        if (proc := self._sender()) is not None:
            self._on_error(proc, error)

    def _read_stdout(self, proc: QProcess) -> None:
        self._out += bytes(proc.readAllStandardOutput().data())
        while b"\n" in self._out:
            line, self._out = self._out.split(b"\n", 1)
            try:
                event = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(event, dict) and event.get("event") == "ready" and proc is self._proc:
                self._on_ready(event)

    def _read_stderr(self, proc: QProcess) -> None:
        self._err += bytes(proc.readAllStandardError().data())
        while b"\n" in self._err:
            raw, self._err = self._err.split(b"\n", 1)
            line = raw.decode("utf-8", "replace").rstrip()
            if proc is self._proc:
                self._stderr.append(line)
                self.log_line.emit(line)

    def _on_ready(self, event: dict[str, object]) -> None:
        token = None
        token_file = event.get("admin_token_file")
        if isinstance(token_file, str):
            try:
                token = Path(token_file).read_text(encoding="utf-8").strip()
            except OSError:
                token = None
        model, log_file = event.get("model"), event.get("log_file")
        self._start_failures = 0
        self.info = ReadyInfo(url=str(event.get("url")), pid=int(str(event.get("pid") or 0)),
                              model=model if isinstance(model, str) else None,
                              admin_token=token,
                              started_s=time.monotonic() - self._started_at,
                              log_file=log_file if isinstance(log_file, str) else None)
        self._set_state("ready")
        self.ready.emit(self.info)

    def _on_error(self, proc: QProcess, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and proc is self._proc:
            self._proc = None
            self._set_state("failed")
            self.died.emit(Crash(-1, [proc.errorString()], "The worker program could not be "
                                 f"started: {proc.errorString()}", restarting=False))

    def _on_finished(self, proc: QProcess, code: int, status: QProcess.ExitStatus) -> None:
        proc.deleteLater()
        if proc is self._stopping:  # stopped on purpose, in the background
            self._stopping = None
            self.stopped_with = code if status == QProcess.ExitStatus.NormalExit else None
            self._kill.stop()
            if self._proc is None:
                self._set_state("stopped")
            return
        if proc is not self._proc:
            return  # an old worker we stopped on purpose
        self._read_stderr(proc)
        if self._err:
            self._stderr.append(self._err.decode("utf-8", "replace").rstrip())
        was_ready = self.info is not None
        self._proc, self.info = None, None
        crashed = status == QProcess.ExitStatus.CrashExit
        exit_code = -proc.exitCode() if crashed and os.name != "nt" else code
        if crashed and exit_code == 0:
            exit_code = -9
        if not was_ready:
            self._start_failures += 1
        restarting = self._start_failures < MAX_START_FAILURES
        tail = list(self._stderr)
        crash = Crash(exit_code, tail, diagnose(exit_code, crashed, tail), restarting)
        self._set_state("restarting" if restarting else "failed")
        self.died.emit(crash)
        if restarting:
            delay = BACKOFF_S[min(self._start_failures, len(BACKOFF_S) - 1)]
            self._restart.start(int(delay * 1000))

    def _shutdown(self, proc: QProcess, wait_ms: int = STOP_WAIT_MS) -> None:
        self._proc = None
        proc.terminate()  # SIGTERM: the worker finishes in-flight requests and exits 0
        if not proc.waitForFinished(wait_ms):
            proc.kill()
            proc.waitForFinished(1000)

    def stop(self, wait_ms: int = STOP_WAIT_MS, block: bool = True) -> None:
        """Stop cleanly: SIGTERM, then kill after ``wait_ms``. ``block=False`` returns at
        once (state ``stopping``; ``stopped`` once the process is gone): the window can
        close while the worker finishes. A blocking stop also waits for one under way."""
        self._restart.stop()
        proc, self._proc, self.info = self._proc, None, None
        if proc is not None:
            proc.terminate()  # SIGTERM: the worker finishes in-flight requests and exits 0
            if self._stopping is not None and self._stopping is not proc:
                self._stopping.kill()  # an earlier stop still under way: no more waiting
            self._stopping = proc
            if not self._kill.isActive():
                self._kill.start(wait_ms)
        if self._stopping is None:
            self._set_state("stopped")
            return
        if not block:
            self._set_state("stopping")
        else:
            stopping = self._stopping
            if not stopping.waitForFinished(max(0, self._kill.remainingTime())):
                stopping.kill()
                stopping.waitForFinished(1000)
            if self._stopping is stopping:  # its finished signal was not delivered
                self._stopping = None
                self.stopped_with = stopping.exitCode() if stopping.exitStatus() == \
                    QProcess.ExitStatus.NormalExit else None
                self._kill.stop()
                self._set_state("stopped")

    def _kill_stopping(self) -> None:
        if self._stopping is not None:
            self._stopping.kill()  # its finished signal ends the stop
