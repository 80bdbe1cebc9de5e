"""The app's saved state (QSettings), typed: one property per setting, sensible defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, Signal

from app.paths import AppPaths

PROVIDERS = ("auto", "cpu", "cuda", "dml")
#: The worker's --kv-dtype choices the Settings view offers.
KV_CHOICES = ("auto", "float16", "int16", "int8")

#: The chat panel's sampling for a new conversation. SmolLM2's model card samples with
#: temperature 0.2 and top-p 0.9; a mild repetition penalty keeps the built-in 135M model
#: out of loops (tools/chat_eval.py measures all three against greedy and the old 0.7/0.95
#: defaults: resources/models/smollm2-135m-instruct/MODEL_CARD.md).
CHAT_SAMPLING: dict[str, Any] = {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1,
                                 "max_tokens": 512}


def model_sampling(card: dict[str, Any] | None) -> dict[str, Any]:
    """The fields of :data:`CHAT_SAMPLING` the model's card recommends (a value whose source
    is a dialect's default is the server's, not the model's, and is left out)."""
    table = ((card or {}).get("meta") or {}).get("sampling")
    if not isinstance(table, dict):
        return {}
    out: dict[str, Any] = {}
    for name in CHAT_SAMPLING:
        entry = table.get(name)
        if not isinstance(entry, dict) or str(entry.get("source", "")).endswith("default"):
            continue
        value = entry.get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


class AppSettings(QObject):
    """QSettings in an INI file under the config dir (one file, easy to inspect or reset)."""

    changed = Signal(str)  # the key

    def __init__(self, paths: AppPaths, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._qs = QSettings(str(paths.config_dir / "settings.ini"), QSettings.Format.IniFormat)

    # --- plumbing -----------------------------------------------------------------------

    def value(self, key: str, default: Any) -> Any:
        raw = self._qs.value(key)
        if raw is None:
            return default
        if isinstance(default, bool):
            return raw in (True, "true", "1", 1)
        if isinstance(default, int):
            try:
                return int(raw)
            except (TypeError, ValueError):
                return default
        if isinstance(default, float):
            try:
                return float(raw)
            except (TypeError, ValueError):
                return default
        if isinstance(default, (list, dict)):
            try:
                parsed = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                return default
            return parsed if isinstance(parsed, type(default)) else default
        return str(raw)

    def set_value(self, key: str, value: Any) -> None:
        stored = json.dumps(value) if isinstance(value, (list, dict)) else value
        self._qs.setValue(key, stored)
        self._qs.sync()
        self.changed.emit(key)

    def sync(self) -> None:
        self._qs.sync()

    # --- worker ---------------------------------------------------------------------------

    @property
    def provider(self) -> str:
        value = self.value("worker/provider", "auto")
        return value if value in PROVIDERS else "auto"

    @property
    def port(self) -> int:
        """0: any free port (the default: nothing to collide with)."""
        return max(0, min(65535, self.value("worker/port", 0)))

    @property
    def api_key(self) -> str:
        return self.value("worker/api_key", "")

    @property
    def remote_url(self) -> str:
        """Non-empty: use this OpenAI-compatible server instead of a local worker."""
        return self.value("worker/remote_url", "").strip()

    @property
    def threads(self) -> int:
        return self.value("worker/threads", 0)

    @property
    def threads_stay_awake(self) -> bool:
        """Model threads spin for microseconds between a step's operators (the worker's
        default; faster on a quiet computer) instead of sleeping at once."""
        return self.value("worker/threads_stay_awake", True)

    @property
    def kv_dtype(self) -> str:
        """How the worker keeps a conversation's KV (its --kv-dtype): "auto" (16-bit, 8-bit
        where the memory limit cannot hold the context in 16), "float16", "int16" or
        "int8"."""
        value = str(self.value("worker/kv_dtype", "auto"))
        return value if value in KV_CHOICES else "auto"

    # --- models ---------------------------------------------------------------------------

    @property
    def model_roots(self) -> list[str]:
        return [str(r) for r in self.value("library/roots", [])]

    def set_model_roots(self, roots: list[str]) -> None:
        unique = list(dict.fromkeys(str(Path(r)) for r in roots))
        self.set_value("library/roots", unique)

    @property
    def last_model(self) -> str:
        """The folder loaded last (loaded again at start); empty: the default model."""
        return self.value("library/last_model", "")

    # --- limits ---------------------------------------------------------------------------

    @property
    def host_ram_limit(self) -> str:
        return self.value("limits/host_ram", "auto")

    @property
    def vram_limit(self) -> str:
        return self.value("limits/vram", "auto")

    # --- chat -----------------------------------------------------------------------------

    @property
    def system_prompt(self) -> str:
        return self.value("chat/system_prompt", "You are a helpful assistant.")

    @property
    def sampling(self) -> dict[str, Any]:
        return self.sampling_for(None)

    def sampling_for(self, card: dict[str, Any] | None) -> dict[str, Any]:
        """A new chat's sampling: the app's defaults, then what the loaded model recommends
        (its card's ``meta.sampling``: the user's preset or the model's own configs, not
        the dialect's defaults), then what was saved here."""
        defaults: dict[str, Any] = dict(CHAT_SAMPLING)
        defaults.update(model_sampling(card))
        saved = self.value("chat/sampling", {})
        return {**defaults, **{k: v for k, v in saved.items() if k in defaults}}
