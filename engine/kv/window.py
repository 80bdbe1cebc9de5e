"""Sliding-window attention with attention sinks, for models whose metadata declares them.

A model folder's ``inference_metadata.yaml`` may say ``sliding_window: W`` and
``attention_sinks: S`` (``sink_tokens`` is read too): every token attends to the first S
tokens of the sequence (the sinks) and to the most recent ones, itself included, at most W
of them. The KV then never holds more than S + W tokens, so a sequence may run far past the
model's context in that much memory (StreamingLLM's cache).

How: a :class:`WindowedRunner` wraps the engine's runner. Its ``length`` and ``tokens``
are the whole sequence; the runner inside holds the sinks and the recent tokens. When the
next token finds the S + W rows full, the oldest ``drop`` tokens after the sinks leave at
once (W / 8: each token sees between 7/8 W and W recent tokens) and the kept ones move
down, their keys re-rotated to their new positions (`engine.model.rotary`), so positions
stay below S + W and the model never meets a position it was not trained on.

`EngineConfig(context_shift=N)` (`--context-shift N`) gives any model whose keys the engine
can re-rotate the same cache over its whole context: the first N tokens and the rest of
the context, llama.cpp's context shift.

Where tokens leave depends only on their index in the sequence: prefill chunks are split at
those points, a verify pass never crosses one. So a sequence gets the same cache, and the
same answer, whether it came in one prompt, in chunks, or turn by turn in a session. What
such a runner cannot do: go back to a point before the last drop (other than the sinks),
or give out KV past the sinks once tokens were dropped — a fresh computation of those
tokens would see the dropped ones. The prefix cache, sessions' pages and the tiered store
therefore keep only ``exact_length`` rows of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engine.errors import ModelLoadError
from engine.kv.quant import rows_shifted, value_dim
from engine.model.io_spec import IOSpec
from engine.model.model_dir import METADATA_FILE, ModelDir
from engine.model.rotary import KeyRotation, key_rotation
from engine.runtime.runner import DecodeRunner, WindowSpec

#: The sequence length a windowed runner accepts: a window has no end.
UNBOUNDED = 1 << 40


def declared_window(model: ModelDir) -> WindowSpec | None:
    """The window a model's own metadata declares (None without one); a clear error for
    values the engine cannot run."""
    meta: Mapping[str, Any] = model.config if model.format == "metadata" else {}
    window = meta.get("sliding_window")
    sinks = meta.get("attention_sinks", meta.get("sink_tokens", 0))
    where = str(model.path / METADATA_FILE)
    if window is None:
        if sinks:
            raise ModelLoadError(f"{where} declares attention_sinks without sliding_window",
                                 hint="attention sinks keep the first tokens of a sliding "
                                      "window: add sliding_window: <tokens>, or remove them")
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 16:
        raise ModelLoadError(f"{where}: sliding_window must be a whole number of tokens, at "
                             f"least 16 (got {window!r})", hint="e.g. sliding_window: 4096")
    if not isinstance(sinks, int) or isinstance(sinks, bool) or not 0 <= sinks < window:
        raise ModelLoadError(f"{where}: attention_sinks must be a whole number from 0 to "
                             f"sliding_window - 1 (got {sinks!r})", hint="e.g. attention_sinks: 4")
    spec = WindowSpec(sinks, window)
    if spec.rows > model.context_length:
        raise ModelLoadError(
            f"{where}: attention_sinks + sliding_window = {spec.rows} tokens exceed "
            f"max_sequence_length ({model.context_length}), the positions the model knows",
            hint="lower sliding_window, or raise max_sequence_length if the model allows it")
    return spec


def windowed(model: ModelDir, spec: IOSpec, context: int, shift: int,
             factory: Callable[[int], Callable[[], DecodeRunner]]) -> Callable[[], DecodeRunner]:
    """`factory(context)`, a maker of runners of that many rows; where the model declares a
    window, or a context shift keeping `shift` tokens is asked for (the window then the
    rest of the context), runners of the window's rows, each wrapped in a WindowedRunner."""
    window = declared_window(model)
    what = "declares a sliding window"
    if window is None and shift > 0:
        if shift > context // 2:
            raise ModelLoadError(f"context_shift keeps {shift} tokens of a {context}-token "
                                 "context: at most half of it",
                                 hint="e.g. --context-shift 4")
        window, what = WindowSpec(shift, context - shift), "was asked to shift its context"
    if window is None:
        return factory(context)
    if window.rows > context:
        raise ModelLoadError(
            f"the model's window needs {window.rows} tokens of KV, the engine was limited "
            f"to {context}", hint="raise kv_max_len, or lower the model's sliding_window")
    keys = [value_dim(p.head_dim, p.dtype) for p in spec.kv_pairs if p.kind == "key"]
    if not keys or len(keys) == len(spec.kv_pairs):
        raise ModelLoadError(f"{model.path} {what}, but its graph's KV "
                             "inputs do not tell keys from values",
                             hint="name them past_key_values.N.key / .value")
    found = key_rotation(model.model_file, model.path / "config.json", window.rows, min(keys))
    if found.rotation is None:
        raise ModelLoadError(
            f"{model.path} {what}, but the engine cannot move its keys to "
            f"new positions: {found.reason}",
            hint="the window needs rotary position embeddings it can read (the graph's "
                 "cos/sin tables, or config.json's rope_theta); remove sliding_window, or "
                 "leave --context-shift at 0")
    rotation, make = found.rotation, factory(window.rows)
    return lambda: WindowedRunner(make(), window, rotation)


class WindowedRunner(DecodeRunner):
    """The whole sequence outside, the sinks and the recent tokens inside (`inner`)."""

    window: WindowSpec  # never None here

    def __init__(self, inner: DecodeRunner, window: WindowSpec, rotation: KeyRotation) -> None:
        super().__init__(inner.session, inner.spec, UNBOUNDED)
        self.inner = inner
        self.window = window
        self.rotation = rotation
        self.path = f"{inner.path}, window {window.window} + {window.sinks} sinks"
        self.transfers_kv = inner.transfers_kv
        self._is_key = [p.kind == "key" for p in inner.spec.kv_pairs]
        #: The sequence length at the last drop (0: none since the sinks alone): the runner
        #: cannot go back before it.
        self.floor = 0
        #: Drops over the runner's life (describe, tests).
        self.drops = 0

    # --- what the rest of the engine asks ------------------------------------------

    @property
    def kv_runner(self) -> DecodeRunner:
        return self.inner

    @property
    def exact_length(self) -> int:
        return self.length if self.floor == 0 else self.window.sinks

    def reachable(self, length: int) -> int:
        return length if length >= self.floor else min(length, self.window.sinks)

    def room_ahead(self) -> int:
        held = self.inner.length
        return self.window.rows - (held if held < self.window.rows else held - self.window.drop)

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    @property
    def kv_bytes(self) -> int:
        return self.inner.kv_bytes

    def growth_bytes(self, total_tokens: int) -> int:
        return self.inner.growth_bytes(min(total_tokens, self.window.rows))

    def reserve(self, total_tokens: int) -> None:
        self.inner.reserve(min(total_tokens, self.window.rows))

    def track_hidden(self, name: str, size: int) -> None:
        super().track_hidden(name, size)
        self.inner.track_hidden(name, size)

    # --- steps ------------------------------------------------------------------------

    def forward(self, token_ids: np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        n = int(token_ids.shape[0])
        if n == 0:
            raise ValueError("forward needs at least one token")
        parts: list[np.ndarray] = []
        at = 0
        logits = np.empty(0, dtype=np.float32)
        while at < n:
            take = min(self._make_room(), n - at)
            logits = self.inner.forward(token_ids[at:at + take], all_logits=all_logits)
            self._advance(token_ids[at:at + take].tolist())
            at += take
            if all_logits and at < n:
                parts.append(np.array(logits))  # the next part's run overwrites it
        if parts:
            logits = np.concatenate([*parts, logits])
        self.last_hidden = self.inner.last_hidden
        return logits

    def forward_greedy(self, token_ids: np.ndarray) -> int:
        if int(token_ids.shape[0]) > self._make_room():
            return int(np.argmax(self.forward(token_ids)))
        token = self.inner.forward_greedy(token_ids)
        self._advance(token_ids.tolist())
        self.last_hidden = self.inner.last_hidden
        return token

    def rewind(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot rewind {n} of {self.length} tokens")
        target = self.length - n
        if self.reachable(target) != target:
            raise ValueError(f"cannot go back to {target} tokens: tokens before {self.floor} "
                             "left the window")
        if target < self.floor:  # back to the sinks: nothing dropped
            self.inner.rewind(self.inner.length - target)
            self.floor = 0
        else:
            self.inner.rewind(n)
        self.length = target
        del self.tokens[target:]

    def export_kv(self, start: int, end: int) -> list[np.ndarray]:
        if end > self.exact_length:
            raise ValueError(f"rows {start}..{end}: only the first {self.exact_length} are "
                             "what a fresh computation gives (tokens left the window)")
        return self.inner.export_kv(start, end)

    def import_kv(self, rows: list[np.ndarray], at: int, token_ids: Sequence[int]) -> None:
        n = rows[0].shape[1] if rows else 0
        if at > self.exact_length or at + n > self.window.rows:
            raise ValueError(f"cannot import {n} rows at {at} into a window of "
                             f"{self.window.rows} rows holding {self.exact_length} exact ones")
        if at < self.length:
            self.rewind(self.length - at)
        self.inner.import_kv(rows, at, token_ids)
        self.length = at + n
        self.tokens.extend(token_ids)

    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray:  # pragma: no cover
        raise AssertionError("WindowedRunner.forward runs the inner runner")

    # --- the window -----------------------------------------------------------------

    def _advance(self, ids: list[int]) -> None:
        self.length += len(ids)
        self.tokens.extend(ids)

    def _make_room(self) -> int:
        """Rows free for the next tokens, after dropping the oldest where none are."""
        free = self.window.rows - self.inner.length
        if free > 0:
            return free
        self._drop()
        return self.window.rows - self.inner.length

    def _drop(self) -> None:
        """The oldest `drop` tokens after the sinks leave; the rest move down to them."""
        inner, sinks, drop = self.inner, self.window.sinks, self.window.drop
        held = inner.length
        rows = inner.export_kv(sinks + drop, held)
        moved = [rows_shifted(r, lambda k: self.rotation.shift(k, sinks + drop, sinks))
                 if key else r for r, key in zip(rows, self._is_key, strict=True)]
        kept = inner.tokens[sinks + drop:held]
        inner.rewind(held - sinks)
        inner.import_kv(moved, sinks, kept)
        self.floor = self.length
        self.drops += 1
