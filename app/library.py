"""The model library: folders the user adds plus the known caches, scanned and inspected.

Roots are adopted in place (nothing is copied): a model folder may sit at any depth under a
root (``org/model``, ``models--org--name/snapshots/<sha>/cpu-int4``...), symlinks are
followed, and a symlink cycle is walked once. A root that is not there (an unplugged
drive) is reported as unavailable, not raised.

Known locations, listed when present:

- the Hugging Face cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``;
- Foundry Local's cache: ``~/.foundry/cache/models`` (its documented default; a cache
  moved with ``foundry cache cd`` is not followed: add that folder by hand);
- the app's own download folder (``AppPaths.models_dir``).

Which folders are models, and what each holds, is the engine's rule (``engine.find_model_dirs``,
``engine.inspect_folder``; the worker's ``/v1/library`` uses the same): metadata, the ONNX
graph's structure (no weights are read, nothing runs) and the tokenizer (FIM family, chat
template). No Qt widgets here; :class:`ScanTask` runs a scan on a pool thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QRunnable, Signal

from app.paths import resources_dir
from engine import (
    FolderFacts,
    find_model_dirs,
    human_size,
    inspect_folder,
    installed_ort_variants,
)

FORMAT_LABELS = {"genai": "genai", "metadata": "ours", "optimum": "optimum",
                 "convention": "onnx (guessed)"}
_DTYPE_LABELS = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


@dataclass(frozen=True)
class LibraryRoot:
    path: Path
    kind: str  # "folder" (added by the user) | "builtin" | "downloads" | "huggingface" |
    #            "foundry"
    label: str

    @property
    def removable(self) -> bool:
        return self.kind == "folder"


@dataclass(frozen=True)
class RootState:
    root: LibraryRoot
    available: bool
    note: str  # "3 models" or "unavailable: ..."


@dataclass(frozen=True)
class LibraryModel:
    path: Path  # as found under its root (absolute; symlinks not resolved)
    name: str
    root: Path
    source: str  # the root's kind
    format: str
    size_bytes: int
    weights_bytes: int
    context_length: int | None
    quantization: str
    fim: str | None
    chat_template: bool
    problem: str | None = None  # None: complete and readable
    warnings: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class ScanResult:
    roots: tuple[RootState, ...]
    models: tuple[LibraryModel, ...]
    hidden: tuple[Path, ...] = field(default=())


# --- where models are -----------------------------------------------------------------------


def huggingface_cache(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else (
        Path.home() / ".cache")
    return base / "huggingface" / "hub"


def foundry_cache() -> Path:
    return Path.home() / ".foundry" / "cache" / "models"


def library_roots(user_roots: Iterable[str | Path], models_dir: Path) -> list[LibraryRoot]:
    """The user's folders (always listed, even when missing) and the known locations that
    exist, without duplicates."""
    roots = [LibraryRoot(Path(r).expanduser(), "folder", str(Path(r).expanduser()))
             for r in user_roots if str(r).strip()]
    builtin = resources_dir() / "models"
    known = [LibraryRoot(builtin, "builtin", "Built-in"),
             LibraryRoot(models_dir, "downloads", f"Downloads ({models_dir})"),
             LibraryRoot(huggingface_cache(), "huggingface",
                         f"Hugging Face cache ({huggingface_cache()})"),
             LibraryRoot(foundry_cache(), "foundry", f"Foundry Local cache ({foundry_cache()})")]
    roots += [r for r in known if r.path.is_dir()]
    unique: dict[str, LibraryRoot] = {}
    for root in roots:
        unique.setdefault(_key(root.path), root)
    return list(unique.values())


def _key(path: Path) -> str:
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):
        return str(path.absolute())


def model_name(folder: Path, root: LibraryRoot) -> str:
    """``org/model`` for a Hugging Face cache entry, else the path under the root."""
    try:
        parts = folder.relative_to(root.path).parts
    except ValueError:
        return folder.name
    if not parts:
        return folder.name
    if root.kind == "huggingface" and parts[0].startswith("models--"):
        repo = parts[0][len("models--"):].replace("--", "/")
        rest = parts[3:] if len(parts) > 2 and parts[1] == "snapshots" else parts[1:]
        return "/".join((repo, *rest))
    return "/".join(parts)


# --- one model ------------------------------------------------------------------------------


def _quantization(facts: FolderFacts) -> str:
    if facts.quantization == "int4":
        return "int4 (MatMulNBits)"
    if facts.quantization == "int8":
        return "int8"
    return _DTYPE_LABELS.get(facts.logits_dtype, facts.logits_dtype or "?")


def inspect_model(folder: Path, root: LibraryRoot) -> LibraryModel:
    """Everything the library shows about one folder (the engine's
    :func:`~engine.inspect_folder`, the worker's rule too); never raises for a bad model."""
    facts = inspect_folder(folder)
    return LibraryModel(
        folder, model_name(folder, root), root.path, root.kind, FORMAT_LABELS[facts.format],
        facts.size_bytes, facts.weights_bytes, facts.context_length,
        _quantization(facts), facts.fim,
        facts.chat_template, facts.problem, facts.warnings)


def scan_library(roots: Sequence[LibraryRoot], hidden: Iterable[str | Path] = ()
                 ) -> ScanResult:
    """Inspect every model under ``roots``; a model reached twice (a link, nested roots) is
    listed once; ``hidden`` folders (removed from the library) are left out."""
    hidden_keys = {_key(Path(h)) for h in hidden}
    states: list[RootState] = []
    models: list[LibraryModel] = []
    seen: set[str] = set()
    for root in roots:
        if not root.path.is_dir():
            why = "is not a folder" if root.path.exists() else "is not there"
            states.append(RootState(root, False, f"unavailable: {root.path} {why} (an "
                                    "unplugged drive or a moved folder?)"))
            continue
        if not os.access(root.path, os.R_OK | os.X_OK):
            states.append(RootState(root, False, "unavailable: no permission to read it"))
            continue
        count = 0
        for folder in find_model_dirs(root.path):
            key = _key(folder)
            if key in seen or key in hidden_keys:
                continue
            seen.add(key)
            models.append(inspect_model(folder, root))
            count += 1
        states.append(RootState(root, True, f"{count} model{'s' if count != 1 else ''}"))
    return ScanResult(tuple(states), tuple(models), tuple(Path(h) for h in hidden))


# --- where a model would run ----------------------------------------------------------------

_PROVIDER_LABELS = {"cpu": "CPU", "cuda": "GPU (CUDA)", "directml": "GPU (DirectML)"}


def gpu_runtime_installed() -> bool:
    return any(v in ("onnxruntime-gpu", "onnxruntime-directml")
               for v in installed_ort_variants())


def where_it_runs(model: LibraryModel, *, loaded_provider: str | None, gpu_runtime: bool,
                  resources: Mapping[str, Any] | None) -> str:
    """"CPU", "GPU (CUDA)", ... : the provider the worker uses for the loaded model; for the
    others, "CPU" without a GPU runtime or GPU, else whether the weights fit the VRAM
    limit the worker reports in ``/v1/resources``."""
    if loaded_provider:
        return _PROVIDER_LABELS.get(loaded_provider, loaded_provider)
    if not gpu_runtime:
        return "CPU"
    governor = (resources or {}).get("governor") or {}
    vram = governor.get("vram") or {}
    if not vram:
        return "GPU if it fits, else CPU"
    if not vram.get("capacity"):
        return "CPU (no GPU found)"
    limit = vram.get("limit")
    size = model.weights_bytes or model.size_bytes
    if isinstance(limit, int) and size > limit:
        return f"CPU (over the {human_size(limit)} VRAM limit)"
    return "GPU"


# --- off the GUI thread ---------------------------------------------------------------------


class ScanSignals(QObject):
    done = Signal(object)  # ScanResult
    failed = Signal(str)


class ScanTask(QRunnable):
    """``scan_library`` on a ``QThreadPool`` thread; the result arrives by ``signals``."""

    def __init__(self, roots: Sequence[LibraryRoot], hidden: Iterable[str | Path]) -> None:
        super().__init__()
        self.roots = tuple(roots)
        self.hidden = tuple(hidden)
        self.signals = ScanSignals()

    def run(self) -> None:
        try:
            result = scan_library(self.roots, self.hidden)
        except Exception as exc:
            self.signals.failed.emit(f"the library scan failed: {exc}")
            return
        self.signals.done.emit(result)
