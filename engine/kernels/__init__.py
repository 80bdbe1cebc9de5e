"""Operators of the engine's own for ONNX Runtime's CPU provider, built from C at install.

`decode_attention.c` is GroupQueryAttention with decode steps and prefill chunks of its own,
`matmul_nbits.c` a 4-bit MatMulNBits: each row's output the same bits however many rows
run together (why and how, in the files). setuptools compiles both as one optional
extension (setup.py) to `decode_attention.ortops`;
ONNX Runtime loads it with `SessionOptions.register_custom_ops_library`, Python never
imports it. Where it was not built (no C compiler at install), `library()` is None and
graphs keep ONNX Runtime's kernels. `status()` says which of these holds, and why;
`python -m engine.kernels` prints it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: "0": run without the engine's kernels (a comparison, or a suspected bug); "portable":
#: their plain C loops even where the CPU has AVX2; "avx2": no AVX-512 (an int16 cache's
#: attention then runs on AVX-VNNI where the CPU has it, else in plain C, and "auto" keeps
#: float16 KV there); "avx512": no AMX (the tests cover each).
ENV = "ONNX_GENAI_KERNELS"
#: "0": MatMulNBits keeps ONNX Runtime's kernel, attention the engine's (ENV turns off both);
#: "all": 8-bit weights run the engine's too (engine.model.matmul_pass.EIGHT_BIT), and so
#: does a CPU without AVX-512 VNNI (the plain C loops: the same bits, 3-10x slower).
MATMUL_ENV = "ONNX_GENAI_MATMUL"
#: What setup.py builds (named so that no importer takes it for a Python module).
LIBRARY = Path(__file__).resolve().parent / "decode_attention.ortops"
#: The library's path instead of LIBRARY (a build kept elsewhere; a missing file tests an
#: install without one).
LIBRARY_ENV = "ONNX_GENAI_KERNELS_LIBRARY"

#: The states of `KernelStatus.state`; the first three run the engine kernels.
READY_STATES = ("avx2+fma", "portable", "built")
_REINSTALL = "re-run the install (./scripts/setup, or pip install -e '.[cpu]' in the clone)"


def library_path() -> Path:
    """Where the compiled kernels' library is looked for (LIBRARY, or LIBRARY_ENV's path)."""
    return Path(os.environ.get(LIBRARY_ENV) or LIBRARY)


def library() -> Path | None:
    """The compiled kernels' library, or None (not built, or turned off by the variable)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    path = library_path()
    return path if path.is_file() else None


def matmul_on() -> bool:
    """Whether MatMulNBits nodes go to the engine's kernel where it is ready (MATMUL_ENV)."""
    return os.environ.get(MATMUL_ENV, "1") != "0"


def matmul_eight_bit() -> bool:
    """Whether 8-bit MatMulNBits nodes go to the engine's kernel too (MATMUL_ENV=all)."""
    return os.environ.get(MATMUL_ENV, "1") == "all"


def _export(name: str, restype: Any) -> Any:
    """The library's function `name`, taking nothing and returning `restype` (None: no
    library, one that cannot load, or a build before the function)."""
    path = library()
    if path is None:
        return None
    try:
        function = getattr(ctypes.CDLL(str(path)), name)
    except (OSError, AttributeError):
        return None
    function.restype = restype
    function.argtypes = []
    return function


def matmul_paths() -> str | None:
    """What the engine's MatMulNBits runs on this CPU: "avx512-vnni" or "portable: <why>"
    (None: no library, or one built before it had this kernel)."""
    paths_of = _export("EngineKernelsMatmulPaths", ctypes.c_char_p)
    return None if paths_of is None else (paths_of() or b"").decode("utf-8", "replace")


def matmul_slow_reason() -> str | None:
    """Why MatMulNBits nodes keep ONNX Runtime's kernel on this CPU (None: they need not)."""
    paths = matmul_paths()
    if paths is None:
        return "the kernels' library predates the engine's MatMulNBits"
    if paths == "avx512-vnni" or paths.startswith("avx2") or matmul_eight_bit():
        return None
    return (f"{paths.partition(': ')[2] or paths}: ONNX Runtime's kernel is faster than the "
            f"plain C loops ({MATMUL_ENV}=all runs them)")


def matmul_fp32_fast() -> bool:
    """Whether the engine's MatMulNBits has vector code for fp32 accuracy on this CPU
    (AVX-512 VNNI; with AVX2 only accuracy level 4 is vectorised)."""
    return matmul_paths() == "avx512-vnni" or matmul_eight_bit()


#: The operators over a float16, an int8 and an int16 KV cache (engine.model.kv16_pass), by
#: their registered names.
F16KV_OP = b"GroupQueryAttentionF16KV"
I8KV_OP = b"GroupQueryAttentionI8KV"
I16KV_OP = b"GroupQueryAttentionI16KV"
_ops_seen: dict[tuple[str, int, int, bytes], bool] = {}


def _registers(op: bytes) -> bool:
    """Whether the library registers `op` (a build before it does not). The name is looked
    for in the file, read once per build."""
    path = library()
    if path is None:
        return False
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, op)
    if key not in _ops_seen:
        _ops_seen[key] = op in path.read_bytes()
    return _ops_seen[key]


def f16kv_ready() -> bool:
    """Whether the library registers the float16-KV attention (else graphs keep float32 KV)."""
    return _registers(F16KV_OP)


def i8kv_ready() -> bool:
    """Whether the library registers the int8-KV attention."""
    return _registers(I8KV_OP)


def i16kv_ready() -> bool:
    """Whether the library registers the int16-KV attention."""
    return _registers(I16KV_OP)


def i16kv_fast() -> bool:
    """Whether the int16-KV attention runs on VPDPWSSD here: AVX-512 VNNI (ENV leaving
    AVX-512 in) or AVX-VNNI's 256-bit form (Intel's client cores; also with AVX-512 left
    out); elsewhere, and with ENV "portable", plain C runs it (the same numbers, slower)."""
    fast = _export("EngineKernelsInt16Fast", ctypes.c_int) if i16kv_ready() else None
    return fast is not None and bool(fast())


def i16kv_preferred() -> bool:
    """Whether kv_dtype "auto" keeps int16 KV (heads allowing): where its attention runs
    on VPDPWSSD (i16kv_fast) and no AMX tiles run the float16 cache's scores (measured
    there, the int16 cache is not), else float16."""
    return i16kv_fast() and "AMX-BF16" not in (status().reason or "")


def c_compiler() -> str | None:
    """The C compiler on PATH now (the one setuptools would take first), or None."""
    names = ["cl"] if sys.platform == "win32" else []
    configured = (sysconfig.get_config_var("CC") or "").split()
    names += [Path(c).name for c in configured[:1]] + ["cc", "gcc", "clang"]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class KernelStatus:
    """Whether this install runs the engine's own kernels: `state` is "avx2+fma" or
    "portable" (ready, with the vector or the plain C code), "built" (ready, an older build
    that does not say which), "off" (ONNX_GENAI_KERNELS=0), "not built" or "cannot load".
    `reason` says why (None for avx2+fma), `fix` what to do (None when nothing is to be
    done), `compiler` the C compiler on PATH now (what a rebuild would use)."""

    state: str
    library: str | None
    reason: str | None
    compiler: str | None
    fix: str | None

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES

    def line(self) -> str:
        """One line for a log, a start-up banner or a bug report."""
        head = {"avx2+fma": "the engine kernels are ready (AVX2+FMA)",
                "portable": "the engine kernels are ready (portable C, "
                            "no AVX2)",
                "built": "the engine kernels are ready",
                "off": "the engine kernels are turned off",
                "not built": "the engine kernels are not built",
                "cannot load": "the engine kernels cannot be loaded",
                }[self.state]
        reason = self.reason
        if self.state == "avx2+fma" and reason is not None and reason.startswith("and "):
            # the wider paths this CPU adds ("and AVX-512, AMX-BF16 for ..."), in the
            # parentheses: "(AVX2+FMA and AVX-512; AMX left out: ...)"
            more, _, why = reason.partition(" (")
            why = why.removesuffix(")")
            head, reason = head[:-1] + f" {more}" + (f"; {why}" if why else "") + ")", None
        text = head + (f": {reason}" if reason else "")
        return text + (f"; {self.fix}" if self.fix else "")

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "ready": self.ready, "library": self.library,
                "reason": self.reason, "compiler": self.compiler, "fix": self.fix,
                "line": self.line()}


def status() -> KernelStatus:
    """What this install runs for GroupQueryAttention on the CPU, and why."""
    compiler = c_compiler()
    if os.environ.get(ENV, "1") == "0":
        return KernelStatus("off", None, f"{ENV}=0 in the environment", compiler,
                            f"unset {ENV} to turn it on")
    path = library_path()
    if not path.is_file():
        if compiler is None:
            reason = (f"no {path.name} in {path.parent} and no C compiler on PATH to build "
                      "it (ONNX Runtime's kernels run instead: slower, and an answer may change "
                      "with the path it takes)")
            fix = ("install a C compiler (Debian/Ubuntu: sudo apt-get install gcc; Fedora: "
                   "sudo dnf install gcc; macOS: xcode-select --install; Windows: the "
                   "Microsoft C++ Build Tools), then " + _REINSTALL)
        else:
            reason = (f"no {path.name} in {path.parent} (ONNX Runtime's kernels run "
                      f"instead); a C compiler is on PATH now: {compiler}")
            fix = _REINSTALL + "; if it is still not built, pip install -v shows why"
        return KernelStatus("not built", None, reason, compiler, fix)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return KernelStatus("cannot load", str(path), str(exc), compiler, _REINSTALL)
    try:
        paths_of = lib.EngineKernelsPaths
    except AttributeError:  # built before the library said which paths it runs
        return KernelStatus("built", str(path), "an older build that does not say whether "
                            "it runs AVX2 or portable C", compiler, _REINSTALL + " to update it")
    paths_of.restype = ctypes.c_char_p
    paths_of.argtypes = []
    state, _, why = (paths_of() or b"").decode("utf-8", "replace").partition(": ")
    if state not in ("avx2+fma", "portable"):  # a newer build's answer this code cannot read
        return KernelStatus("built", str(path), f"it reports {state!r}", compiler, None)
    return KernelStatus(state, str(path), why or None, compiler, None)


@dataclass(frozen=True)
class KernelUse:
    """What one loaded model runs: of its `nodes` GroupQueryAttention nodes, `moved` run
    the engine's kernel; `kept` counts why the others keep ONNX Runtime's. The same for its
    `matmul_nodes` MatMulNBits nodes (`matmul_moved`, `matmul_kept`)."""

    status: KernelStatus
    nodes: int
    moved: int
    kept: Counter[str] = field(default_factory=Counter)
    matmul_nodes: int = 0
    matmul_moved: int = 0
    matmul_kept: Counter[str] = field(default_factory=Counter)
    #: The live KV cache's element type ("int16" / "float16" / "int8" / "float32"; None: the
    #: graph has none), and why it is not 16-bit where the model's KV could have been (None
    #: otherwise).
    kv_dtype: str | None = None
    kv_reason: str | None = None

    def line(self) -> str:
        if not self.nodes:
            text = "no GroupQueryAttention in the graph: the engine kernel has nothing to run"
        else:
            text = f"{self.moved} of {self.nodes} GroupQueryAttention nodes run the engine " \
                "kernel" + _others(self.nodes - self.moved, self.kept)
        if self.matmul_nodes:
            text += f"; {self.matmul_moved} of {self.matmul_nodes} MatMulNBits nodes run the " \
                "engine kernel" + _others(self.matmul_nodes - self.matmul_moved,
                                          self.matmul_kept)
        return text

    def kv_line(self) -> str | None:
        """The KV cache's element type, and why it is not 16-bit (None: no KV)."""
        if self.kv_dtype is None:
            return None
        return f"KV cache {self.kv_dtype}" + (f" ({self.kv_reason})" if self.kv_reason else "")

    def as_dict(self) -> dict[str, object]:
        return {**self.status.as_dict(), "attention_nodes": self.nodes, "moved": self.moved,
                "kept": dict(self.kept), "matmul_nodes": self.matmul_nodes,
                "matmul_moved": self.matmul_moved, "matmul_kept": dict(self.matmul_kept),
                "kv_dtype": self.kv_dtype, "kv_reason": self.kv_reason,
                "kv_summary": self.kv_line(), "summary": self.line()}


def _others(count: int, kept: Counter[str]) -> str:
    if not kept:
        return ""
    whys = [why if len(kept) == 1 else f"{why} ({n})" for why, n in kept.most_common()]
    return f"; ONNX Runtime runs the other {count}: " + "; ".join(whys)
