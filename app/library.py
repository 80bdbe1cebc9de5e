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

Inspection reads metadata and the ONNX graph's structure (``engine.model.model_dir``,
``engine.model.onnx_scan``: no weights are read, nothing runs) and the tokenizer (FIM family,
chat template). No Qt widgets here; :class:`ScanTask` runs a scan on a pool thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QRunnable, Signal

from app.paths import resources_dir
from engine.errors import EngineError
from engine.model.model_dir import load_model_dir
from engine.model.onnx_scan import ScanError, scan_onnx

MODEL_MARKERS = ("genai_config.json", "inference_metadata.yaml")
FORMAT_LABELS = {"genai": "genai", "metadata": "ours", "optimum": "optimum",
                 "convention": "onnx (guessed)"}
_DTYPE_LABELS = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
MAX_DEPTH = 8


def human_size(n: int | None) -> str:
    """Decimal units as file managers show them: ``1.2 MB``."""
    if n is None:
        return "?"
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


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


def looks_like_model(folder: Path) -> bool:
    try:
        if any((folder / m).is_file() for m in MODEL_MARKERS):
            return True
        return any(e.name.endswith(".onnx") and e.is_file() for e in os.scandir(folder))
    except OSError:
        return False


def find_model_dirs(root: Path, max_depth: int = MAX_DEPTH) -> Iterator[Path]:
    """Model folders under ``root`` (itself included), depth first, in name order; hidden
    folders are skipped, a model folder is not searched further, and each real folder is
    visited once (symlink cycles end)."""
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            st = os.stat(folder)
        except OSError:
            continue  # a dangling link, a link loop (ELOOP), no permission
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        if looks_like_model(folder):
            yield folder
            continue
        if depth >= max_depth:
            continue
        try:
            children = sorted((e for e in os.scandir(folder)
                               if not e.name.startswith(".") and e.is_dir()),
                              key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        stack.extend((Path(e.path), depth + 1) for e in children)


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


def folder_size(folder: Path) -> int:
    """Bytes of the files in the folder (links followed: the HF cache links to blobs)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def completeness_problem(folder: Path) -> str | None:
    """None when every ``.onnx`` file parses and each external-data file it references is
    present at the size the graph reads; else what is wrong, in words."""
    try:
        onnx_files = sorted(p for p in folder.iterdir() if p.suffix == ".onnx" and p.is_file())
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if not onnx_files:
        return "incomplete: no .onnx file in the folder"
    for model_file in onnx_files:
        try:
            scanned = scan_onnx(model_file)
        except (ScanError, OSError):
            return (f"incomplete: {model_file.name} ({human_size(model_file.stat().st_size)}) "
                    "is not a whole ONNX file (truncated download?)")
        expected: dict[str, int] = {}
        for tensor in scanned.initializers:
            if tensor.data_location == 1:  # EXTERNAL
                entry = tensor.external
                end = int(entry.get("offset", 0) or 0) + int(entry.get("length", 0) or 0)
                loc = entry.get("location", "")
                expected[loc] = max(expected.get(loc, 0), end)
        for loc, need in sorted(expected.items()):
            data = model_file.parent / loc
            if not data.is_file():
                return f"incomplete: {loc} is missing (expected {human_size(need)})"
            size = data.stat().st_size
            if size < need:
                return (f"incomplete: {loc} is {human_size(size)}, expected "
                        f"{human_size(need)}")
    return None


def _format_of(folder: Path) -> str:
    for marker, fmt in (("genai_config.json", "genai"), ("inference_metadata.yaml", "metadata"),
                        ("config.json", "optimum")):
        if (folder / marker).is_file():
            return FORMAT_LABELS[fmt]
    return FORMAT_LABELS["convention"]


def _declared_context(folder: Path) -> int | None:
    """The context length a folder's JSON config declares (cheap; for broken folders)."""
    for name, keys in (("genai_config.json", ("model", "context_length")),
                       ("config.json", ("max_position_embeddings",))):
        try:
            value: Any = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def _quantization(quant: str, outputs: Mapping[str, Any]) -> str:
    if quant == "int4":
        return "int4 (MatMulNBits)"
    if quant == "int8":
        return "int8"
    logits = outputs.get("logits") or next(iter(outputs.values()), None)
    dtype = getattr(logits, "dtype", "")
    return _DTYPE_LABELS.get(dtype, dtype or "?")


def _tokenizer_facts(folder: Path) -> tuple[str | None, bool, str | None]:
    """(FIM family, has a chat template, problem)."""
    from engine.text.fim import detect_fim_family
    from engine.text.tokenizer import Tokenizer

    try:
        tokenizer = Tokenizer.from_dir(folder)
    except EngineError as exc:
        return None, False, exc.message
    family = detect_fim_family(tokenizer)
    return (family.name if family else None), tokenizer.has_chat_template, None


def inspect_model(folder: Path, root: LibraryRoot) -> LibraryModel:
    """Everything the library shows about one folder; never raises for a bad model."""
    size = folder_size(folder)
    fim, template, tok_problem = _tokenizer_facts(folder)
    try:
        md = load_model_dir(folder)
    except EngineError as exc:
        problem = completeness_problem(folder) or exc.message
        return LibraryModel(folder, model_name(folder, root), root.path, root.kind,
                            _format_of(folder), size, 0, _declared_context(folder), "?", fim,
                            template, problem)
    except (OSError, ValueError) as exc:  # a file vanished or is unreadable mid-scan
        return LibraryModel(folder, model_name(folder, root), root.path, root.kind,
                            _format_of(folder), size, 0, None, "?", fim, template,
                            f"unreadable: {exc}")
    return LibraryModel(
        folder, model_name(folder, root), root.path, root.kind, FORMAT_LABELS[md.format], size,
        md.weights_bytes, md.context_length,
        _quantization(md.graph.quantization, md.graph.outputs), fim, template, tok_problem,
        md.warnings)


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
    from engine.runtime.providers import installed_ort_variants

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
