"""`python -m engine serve`: bind, load, print one ready line, serve until SIGINT/SIGTERM.

The ready line is the only thing written to stdout, once the socket listens::

    {"event":"ready","url":"http://127.0.0.1:8012","host":"127.0.0.1","port":8012,
     "pid":1234,"model":"qwen2.5-coder-1.5b","admin_token_file":"/home/u/.config/..."}

The ready line also names ``log_file``: the worker logs to one rotating file in the user
log folder and to stderr (engine/server/worker_log.py). On a signal the server stops
accepting, lets in-flight requests finish for ``--graceful-shutdown`` seconds, cancels the
rest, stops the engine thread, exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import select
import socket
import sys
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

from engine.config import EngineConfig, KVStoreConfig
from engine.errors import EngineError
from engine.kernels import status as kernel_status
from engine.model.default_model import default_model_dir
from engine.server.app import VERSION, build_context, create_app
from engine.server.config import ServerConfig
from engine.server.read_deadline import read_deadline_protocol
from engine.server.security import (
    default_presets_file,
    ensure_admin_token,
    resolve_api_key,
)
from engine.server.worker_log import default_log_file, setup, startup_log

log = logging.getLogger("engine.server")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    token, token_file = ensure_admin_token(args.admin_token_file)
    # A desktop worker: threads spin only for microseconds (between a step's operators,
    # never once a request is done), and editors' prompts keep their KV in the tiered
    # store so a restart does not recompute them.
    store = None if args.no_kv_store else KVStoreConfig(
        disk_dir=str(args.kv_store_dir) if args.kv_store_dir else None)
    engine = EngineConfig(provider=args.provider, intra_op_threads=args.threads,
                          kv_max_len=args.kv_max_len, vram_limit=args.vram_limit,
                          host_ram_limit=args.host_ram_limit, spin_duration_us=args.spin_us,
                          kv_store=store, cache_reuse=args.cache_reuse,
                          kv_dtype=args.kv_dtype, adaptive_threads=not args.fixed_threads,
                          context_shift=args.context_shift)
    model = args.model
    if model is None and not args.models_dir and not args.no_default_model:
        model = default_model_dir()  # a fresh install answers at once (None: not installed)
    return ServerConfig(
        host=args.host, port=args.port, model=model, models_dirs=tuple(args.models_dir),
        api_key=resolve_api_key(args.api_key, args.api_key_file), admin_token=token,
        admin_token_file=token_file,
        cors_origins=tuple(args.cors_origin), max_body_bytes=args.max_body_bytes,
        max_queue=args.max_queue, engine=engine, graceful_shutdown_s=args.graceful_shutdown,
        access_log=args.access_log, session_idle_s=args.session_idle_timeout,
        max_sessions=args.max_sessions, read_timeout_s=args.read_timeout,
        presets=args.presets or default_presets_file())


def warn_if_exposed(config: ServerConfig) -> None:
    """A loud warning on stderr when the bind address is not loopback."""
    if config.loopback:
        return
    lines = [f"the worker listens on {config.host}: other machines on your network can reach it"]
    if config.api_key is None:
        lines.append("and there is NO --api-key: anyone who can reach it can use your model")
    bar = "!" * 78
    log.warning("\n%s\n%s\n%s", bar, "\n".join(f"!! WARNING: {line}" for line in lines), bar)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
    # proto says TCP; with proto 0 each SSE chunk after the headers would wait ~40 ms for a
    # delayed ACK on kept-alive connections.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class WorkerServer(uvicorn.Server):
    """uvicorn's server, plus the ready line, an exit code of 0 after a signal, and a main
    loop that sleeps until the server stops (an idle worker wakes for nothing).

    uvicorn's loop ticks ten times a second to refresh the Date header and to see whether
    a stop was asked. Here the Date header comes with each answer (RequestIdMiddleware)
    and a stop wakes the loop (the should_exit setter). Measured on the 2-core VM
    (2026-12-05), the built-in model's idle worker used 26 ms of CPU a second with
    uvicorn's tick and the CPU watcher's looks, 10 ms with a one-second tick and 0.00 ms
    with neither (bench/README.md, spin section).
    """

    #: Seconds between two housekeeping ticks while nothing asks the server to stop.
    TICK_S = 30.0

    def __init__(self, config: uvicorn.Config, ready: dict[str, Any] | None,
                 stopping: threading.Event | None = None) -> None:
        self._stopping = stopping
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        super().__init__(config)
        self._ready = ready

    async def main_loop(self) -> None:
        wake = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), wake)
        counter = 0  # in uvicorn's tenths of a second: each tick does its once-a-second work
        while not await self.on_tick(counter) and not self.should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.TICK_S)
            counter = (counter + 10) % 864000

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Whichever way a stop begins (a signal, the parent gone, a test), ``stopping``
        says so at once (ServerContext.stopping: endless streams end)."""
        self._should_exit = value
        if value and self._stopping is not None:
            self._stopping.set()
        if value and self._wake is not None:  # from a signal handler or another thread
            loop, wake = self._wake
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(wake.set)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._ready is not None:
            sys.stdout.write(json.dumps(self._ready) + "\n")
            sys.stdout.flush()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()  # a graceful stop is a normal exit, not a re-raised signal


def uvicorn_config(app: Any, config: ServerConfig) -> uvicorn.Config:
    # one access line per request comes from RequestIdMiddleware (with its id); each
    # request must arrive whole within read_timeout_s (engine/server/read_deadline.py)
    # (the Date header comes from RequestIdMiddleware, fresh on each answer: WorkerServer)
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                          timeout_graceful_shutdown=max(1, round(config.graceful_shutdown_s)),
                          ws="none", http=read_deadline_protocol(config.read_timeout_s),
                          date_header=False)


def log_startup(config: ServerConfig, ctx: Any, url: str, log_file: Any) -> None:
    """The facts a bug report needs, once, in the file and on stderr."""
    engine = config.engine
    startup_log.info("worker %s pid %d listening on %s; log file %s", VERSION, os.getpid(),
                     url, log_file or "none")
    current = ctx.models.current
    if current is None:
        startup_log.info("no model loaded (models from %s)",
                         ", ".join(map(str, config.models_dirs)) or "nowhere")
    else:
        facts = current.engine.describe()
        startup_log.info("model %s (%s): provider %s, %s threads, context %s, decode %s",
                         current.id, facts.get("model"), facts.get("provider"),
                         facts.get("threads"), facts.get("context_length"),
                         facts.get("decode_path"))
        window = current.engine.runner.window
        if window is not None:
            startup_log.info("window: %d recent tokens and %d sinks (%d KV rows); sequences "
                             "run past the context", window.window, window.sinks, window.rows)
        use = current.engine.kernel_use
        if use is not None:
            startup_log.info("attention: %s", use.line())
            if use.kv_line():
                startup_log.info("kv: %s, %d bytes a token", use.kv_line(),
                                 current.engine.spec.kv_bytes_per_token)
    startup_log.info("kernels: %s", kernel_status().line())
    startup_log.info("limits: queue %d, body %d bytes, read timeout %g s, batch %s, "
                     "kv_max_len %s, vram %s, host RAM %s, KV store %s; API key %s, CORS %s",
                     config.max_queue, config.max_body_bytes, config.read_timeout_s,
                     engine.max_batch, engine.kv_max_len,
                     engine.vram_limit, engine.host_ram_limit,
                     "off" if engine.kv_store is None else "on",
                     "required" if config.api_key else "none",
                     ", ".join(config.cors_origins) or "none")


def run(args: argparse.Namespace) -> int:
    log_file = setup(None if args.no_log_file else (args.log_file or default_log_file()),
                     access=args.access_log)
    try:
        config = config_from_args(args)
    except OSError as exc:
        raise EngineError(f"cannot read or create the admin token file: {exc}",
                          hint="pass --admin-token-file PATH in a folder you can write") from exc
    warn_if_exposed(config)
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        raise EngineError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}",
                          hint="pick another --port (0 = any free port) or stop the program "
                          "using it") from exc
    ctx = build_context(config)  # loads --model: a bad folder fails before the ready line
    app = create_app(config, ctx)
    current = ctx.models.current
    ready = {"event": "ready", "url": url_of(sock), "host": config.host,
             "port": sock.getsockname()[1], "pid": os.getpid(),
             "model": current.id if current else None,
             "admin_token_file": str(config.admin_token_file),
             "log_file": None if log_file is None else str(log_file)}
    log_startup(config, ctx, ready["url"], log_file)
    server = WorkerServer(uvicorn_config(app, config), ready, ctx.stopping)
    if args.parent_pid:
        watch_parent(server, args.parent_pid)
    server.run(sockets=[sock])
    return 0


#: Seconds between a parent watcher's looks at whether the server stopped, where a pidfd
#: wakes it when the parent exits.
PIDFD_CHECK_S = 10.0


def parent_alive(pid: int) -> bool:
    """Whether ``pid`` still runs and (on POSIX) is still our parent: an orphaned worker
    is adopted by another process, which is how a parent killed with SIGKILL shows."""
    if os.name != "nt" and os.getppid() != pid:
        return False
    try:
        import psutil

        return bool(psutil.pid_exists(pid))
    except Exception:  # psutil is a dependency; be safe anyway
        return True


def watch_parent(server: uvicorn.Server, pid: int, every_s: float = 0.5) -> threading.Thread:
    """Stop ``server`` gracefully once process ``pid`` is gone. On Linux the thread sleeps
    on a pidfd that wakes it when the process exits (and every ``PIDFD_CHECK_S`` to see
    whether the server stopped); elsewhere it looks every ``every_s``."""
    def watch() -> None:
        try:
            exits: int | None = os.pidfd_open(pid)  # Linux 5.3+
        except (AttributeError, OSError):  # elsewhere, or the process is already gone
            exits = None
        try:
            while not server.should_exit:
                if not parent_alive(pid):
                    log.warning("the app (pid %d) has gone: stopping", pid)
                    server.should_exit = True
                    return
                if exits is None:
                    time.sleep(every_s)
                else:
                    select.select([exits], [], [], PIDFD_CHECK_S)
        finally:
            if exits is not None:
                os.close(exits)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
