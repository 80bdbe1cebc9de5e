"""The test suite's own home folder, and the guard that fails a test writing under the user's.

``isolate_home`` points HOME, the XDG folders and the other tools' homes a test could reach
(pip's Rust probe through rustup, Cargo, the Hugging Face cache) at a temporary folder, for
this process and every process it starts. ``HomeGuard`` records, through a Python audit
hook, each write this process makes under the user's real home: a test is failed for its
own writes only, never for what another program on the machine writes there meanwhile.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

#: XDG base folders and where they go under the suite's home (platformdirs and Qt read them).
XDG_FOLDERS = (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
               ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state"),
               ("XDG_RUNTIME_DIR", "runtime"))

#: Homes of other tools that a user may have set to a folder of their own, which would
#: win over HOME. pip runs ``rustc --version`` for its User-Agent whenever a ``rustc`` is
#: on PATH, and rustup's ``rustc`` writes ``$RUSTUP_HOME/settings.toml`` when it has none.
TOOL_HOMES = (("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo"),
              ("HF_HOME", ".cache/huggingface"))

#: Variables that would send a tool past the homes above.
CLEARED = ("ONNX_LOCAL_LLM_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE",
           "PIP_CACHE_DIR")


def real_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's home as this process found it: ``$HOME``, else the password database."""
    return Path(environ.get("HOME") or Path.home()).absolute()


def isolate_home() -> Path:
    """Make a temporary home and point HOME, the XDG folders and TOOL_HOMES at it, in
    ``os.environ`` (so in every process started from here on). Returns the new home."""
    home = Path(tempfile.mkdtemp(prefix="onnx-local-llm-tests-home-"))
    os.environ["HOME"] = str(home)
    for variable, folder in (*XDG_FOLDERS, *TOOL_HOMES):
        (home / folder).mkdir(parents=True, mode=0o700, exist_ok=True)
        os.environ[variable] = str(home / folder)
    for variable in CLEARED:
        os.environ.pop(variable, None)
    return home


#: Audit events that write, and which of their arguments are the paths written.
_WRITES = {"open": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.remove": (0,),
           "os.rmdir": (0,), "os.symlink": (1,), "os.link": (1,), "os.truncate": (0,),
           "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,),
           "sqlite3.connect": (0,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: The events whose last argument is a dir_fd (-1 or None: none).
_DIR_FD_EVENTS = {"os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.utime"}


class HomeGuard:
    """Records every write this Python process makes under ``home``, except under the
    ``allowed`` folders (the suite's own home, the temporary folder, the repository, the
    interpreter's prefixes where the byte-code cache goes). ``take`` hands the writes
    recorded since the last call over. An audit hook cannot be removed: one guard a process."""

    def __init__(self, home: Path, allowed: Iterable[Path | str]) -> None:
        # a home at / (some containers) is the whole machine, not a user's folder: no guard
        self.home = tuple(form for form in self._forms(home) if form != os.sep)
        # a folder holding the whole home (a repository at ~, a prefix at /) allows nothing
        self.allowed = tuple(form for folder in allowed for form in self._forms(folder)
                             if not any(h.startswith(form) for h in self.home))
        self._seen: list[str] = []

    @staticmethod
    def _forms(folder: Path | str) -> tuple[str, ...]:
        """The folder as written and with its links resolved, each ending in a separator."""
        forms = {os.path.abspath(folder), os.path.realpath(folder)}
        return tuple(form.rstrip(os.sep) + os.sep for form in forms)

    def install(self) -> None:
        sys.addaudithook(self._hook)

    def allow(self, folder: Path | str) -> None:
        self.allowed += self._forms(folder)

    def take(self) -> list[str]:
        seen, self._seen = self._seen, []
        return seen

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        where = _WRITES.get(event)
        if where is None:
            return
        try:  # an exception here would stop the write itself: never raise
            if event == "open" and not (isinstance(args[2], int) and args[2] & _WRITE_FLAGS):
                return
            if event in _DIR_FD_EVENTS and args[-1] not in (None, -1):
                return  # relative to a folder descriptor (shutil.rmtree's walk): not known
            if event == "os.rename" and (args[2] not in (None, -1) or args[3] not in (None, -1)):
                return
            for index in where:
                target = args[index]
                if isinstance(target, int) or target is None or target == ":memory:":
                    continue  # a file descriptor, an in-memory database
                path = os.path.abspath(os.fsdecode(target))  # type: ignore[arg-type]
                if self.writes_home(path):
                    self._seen.append(f"{event} {path}")
        except Exception:
            pass

    def writes_home(self, path: str) -> bool:
        """Whether a write at ``path`` (absolute) lands in the watched home."""
        path = path.rstrip(os.sep) + os.sep
        return (any(path.startswith(h) for h in self.home)
                and not any(path.startswith(a) for a in self.allowed))


def default_allowed(root: Path) -> list[Path | str]:
    """Where a test run may write even when it lies under the user's home: the repository
    (pytest's cache), the temporary folder, the interpreter's prefixes and site-packages
    (byte-code). Called before ``isolate_home``: the user site follows HOME."""
    import site
    import sysconfig

    allowed: list[Path | str] = [root, tempfile.gettempdir(), sys.prefix,
                                 sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                                 site.getusersitepackages(), sysconfig.get_path("purelib")]
    if sys.pycache_prefix:
        allowed.append(sys.pycache_prefix)
    return allowed
