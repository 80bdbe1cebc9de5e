"""A model's recommended sampling, each value with where it came from.

A request that leaves a sampling field out gets, in this order:

1. the user's preset: ``presets.json`` in the worker's config folder (``--presets``), an
   object keyed by model id or folder name (``"*"``: every model) whose entries take this
   worker's field names or Ollama's Modelfile ``PARAMETER`` names (``repeat_penalty``,
   ``num_predict``); an entry's ``"infill"`` object holds the values for code completion;
2. the model folder's ``generation_config.json`` (Hugging Face);
3. the ``search`` section of its ``genai_config.json`` (onnxruntime-genai), leaving out the
   values its builder writes for every model (``temperature`` 1, ``top_k`` 50, ``top_p`` 1,
   ``repetition_penalty`` 1, ``do_sample`` false): they recommend nothing;
4. the dialect's own default (OpenAI, llama.cpp, Ollama: ``engine/server/options.py``).

Code completion (``/infill``, a ``suffix`` on ``/v1/completions`` or ``/api/generate``)
takes only the preset's ``"infill"`` values and is otherwise greedy: a chat model's
recommended temperature is for conversation, not for the next line of code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Dialect = Literal["openai", "llamacpp", "ollama"]

#: The fields a recommendation may set, and each one's type.
FIELDS: dict[str, type] = {"temperature": float, "top_p": float, "top_k": int,
                           "min_p": float, "repetition_penalty": float,
                           "presence_penalty": float, "frequency_penalty": float,
                           "max_tokens": int, "seed": int}
#: Other spellings of them (Ollama's Modelfile PARAMETER names, llama.cpp's, Hugging
#: Face's): one preset file serves all.
ALIASES = {"repeat_penalty": "repetition_penalty", "num_predict": "max_tokens",
           "n_predict": "max_tokens", "max_new_tokens": "max_tokens", "temp": "temperature"}
PRESET = "preset"
HF_CONFIG = "generation_config.json"
GENAI_CONFIG = "genai_config.json"
#: What onnxruntime-genai's builder writes into every ``search`` section.
_BUILDER_SEARCH = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}
#: Each dialect's defaults for the fields a request leaves out (none for max_tokens and
#: seed: the rest of the context, and a random seed).
DIALECT_DEFAULTS: dict[Dialect, dict[str, float | int]] = {
    "openai": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
               "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
    "llamacpp": {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
                 "repetition_penalty": 1.0, "presence_penalty": 0.0,
                 "frequency_penalty": 0.0},
    "ollama": {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.0,
               "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
}
DIALECT_WORDS: dict[Dialect, str] = {"openai": "OpenAI default", "llamacpp": "llama.cpp default",
                                     "ollama": "Ollama default"}
#: Code completion's temperature when neither the request nor the preset sets one.
CODE_GREEDY = "code completion: greedy"


@dataclass(frozen=True)
class Recommended:
    value: float | int
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@dataclass(frozen=True)
class ModelSampling:
    """What a model recommends: for conversation and completion (``general``) and for code
    completion (``infill``, from the preset only). ``problems``: preset entries skipped."""

    general: Mapping[str, Recommended] = field(default_factory=dict)
    infill: Mapping[str, Recommended] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def for_dialect(self, dialect: Dialect, code: bool = False) -> dict[str, Recommended]:
        """Every field's value for a request on ``dialect`` that leaves it out; ``code``:
        a code completion (greedy, then the preset's ``infill`` values)."""
        out = {name: Recommended(value, DIALECT_WORDS[dialect])
               for name, value in DIALECT_DEFAULTS[dialect].items()}
        if code:
            out["temperature"] = Recommended(0.0, CODE_GREEDY)
        out.update(self.infill if code else self.general)
        return out

    def value(self, dialect: Dialect, name: str, code: bool = False) -> Any:
        """The value for a left-out field (``None``: the dialect has no default)."""
        chosen = self.for_dialect(dialect, code).get(name)
        return None if chosen is None else chosen.value

    def table(self, dialect: Dialect, code: bool = False) -> dict[str, dict[str, Any]]:
        """``{field: {"value": .., "source": ..}}`` for the worker's routes."""
        return {name: rec.as_dict() for name, rec in self.for_dialect(dialect, code).items()}


#: The ranges a request's fields are held to (engine.server.schemas): a recommendation
#: outside them is left out (and named, for a preset) instead of failing every request.
RANGES: dict[str, tuple[float, float]] = {"temperature": (0.0, 100.0), "top_p": (0.0, 1.0),
                                          "min_p": (0.0, 1.0), "top_k": (-1, math.inf),
                                          "repetition_penalty": (0.01, 100.0)}


def _number(name: str, raw: Any) -> float | int:
    kind = FIELDS[name]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"{name}: expected a number, got {raw!r}")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ValueError(f"{name}: expected a finite number, got {raw!r}")
    if kind is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError(f"{name}: expected a whole number, got {raw!r}")
        return int(raw)
    return float(raw)


def _fields(raw: Mapping[str, Any], source: str, *, strict: bool,
            skip: Iterable[str] = ()) -> tuple[dict[str, Recommended], list[str]]:
    """The known fields of ``raw`` (aliases folded); unknown or bad ones are problems when
    ``strict`` (a preset the user wrote), silently left out otherwise (a model's config)."""
    out: dict[str, Recommended] = {}
    problems: list[str] = []
    for key, raw_value in raw.items():
        if key in skip:
            continue
        name = ALIASES.get(key, key)
        if name not in FIELDS:
            if strict:
                problems.append(f"{key}: not a sampling field (expected one of "
                                f"{', '.join(sorted({*FIELDS, *ALIASES}))})")
            continue
        try:
            value = _number(name, raw_value)
            if name == "max_tokens" and value < 1:
                continue  # Ollama's -1 / -2, llama.cpp's -1: no limit, as a bare request
            low, high = RANGES.get(name, (-math.inf, math.inf))
            if not low <= value <= high:
                raise ValueError(f"{name}: expected {low:g} to {high:g}, got {raw_value!r}")
            out[name] = Recommended(value, source)
        except ValueError as exc:
            if strict:
                problems.append(str(exc))
    return out, problems


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def from_generation_config(folder: Path) -> dict[str, Recommended]:
    """Hugging Face ``generation_config.json``: ``do_sample: false`` means greedy."""
    cfg = _read_json(folder / HF_CONFIG)
    if cfg is None:
        return {}
    if cfg.get("do_sample") is False:
        return {"temperature": Recommended(0.0, f"{HF_CONFIG} (do_sample: false)")}
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    values, _ = _fields({k: cfg[k] for k in keys if k in cfg}, HF_CONFIG, strict=False)
    return values


def from_genai_config(folder: Path) -> dict[str, Recommended]:
    """onnxruntime-genai's ``search`` section, less its builder's boilerplate."""
    cfg = _read_json(folder / GENAI_CONFIG)
    search = cfg.get("search") if cfg is not None else None
    if not isinstance(search, dict):
        return {}
    keys = ("temperature", "top_p", "top_k", "repetition_penalty")
    chosen = {k: search[k] for k in keys if k in search and search[k] != _BUILDER_SEARCH[k]}
    values, _ = _fields(chosen, GENAI_CONFIG, strict=False)
    return values


def _norm(name: str) -> str:
    name = name.strip().lower()
    return name[: -len(":latest")] if name.endswith(":latest") else name.replace(":", "-")


def preset_for(presets: Mapping[str, Any], names: Iterable[str]
               ) -> tuple[dict[str, Recommended], dict[str, Recommended], list[str]]:
    """The preset entries that name the model (``"*"`` first, then the model's own),
    as (general, infill, problems)."""
    wanted = {_norm(n) for n in names if n}
    general: dict[str, Recommended] = {}
    infill: dict[str, Recommended] = {}
    problems: list[str] = []
    entries = [(k, v) for k, v in presets.items() if k == "*"]
    entries += [(k, v) for k, v in presets.items() if k != "*" and _norm(k) in wanted]
    for key, entry in entries:
        if not isinstance(entry, dict):
            problems.append(f"presets.json: {key!r}: expected an object of parameters, "
                            f"got {type(entry).__name__}")
            continue
        source = PRESET if key != "*" else f"{PRESET} (*)"
        values, bad = _fields(entry, source, strict=True, skip=("infill",))
        general.update(values)
        problems += [f"presets.json: {key!r}: {p}" for p in bad]
        code = entry.get("infill")
        if code is not None:
            if not isinstance(code, dict):
                problems.append(f"presets.json: {key!r}: infill: expected an object")
                continue
            values, bad = _fields(code, source, strict=True)
            infill.update(values)
            problems += [f"presets.json: {key!r}: infill: {p}" for p in bad]
    return general, infill, problems


def read_presets(path: Path | None) -> tuple[dict[str, Any], list[str]]:
    """The presets file's object ({} when there is none), and what is wrong with it."""
    if path is None or not path.is_file():
        return {}, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {}, [f"{path}: not readable as JSON ({exc}); fix or remove it"]
    if not isinstance(data, dict):
        return {}, [f"{path}: expected an object keyed by model name, e.g. "
                    '{"my-model": {"temperature": 0.7}}']
    return data, []


def model_sampling(folder: Path, names: Iterable[str], presets_path: Path | None = None
                   ) -> ModelSampling:
    """The model in ``folder``'s recommendations (see the module docstring); ``names``:
    what a preset entry may call it (id, folder name)."""
    presets, problems = read_presets(presets_path)
    general: dict[str, Recommended] = {}
    general.update(from_genai_config(folder))
    general.update(from_generation_config(folder))
    preset, infill, bad = preset_for(presets, names)
    general.update(preset)
    return ModelSampling(general, infill, tuple(problems + bad))
