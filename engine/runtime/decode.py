"""Decode runners: one ORT session, its KV state, and a `forward(token_ids)` step.

Every runner keeps `length` tokens of KV, appends on `forward`, and drops the tail on
`rewind`. The per-token path is kept lean: buffers are bound once and inputs are updated
in place, because Python overhead per step is what separates a loop from a C++ peer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.model.io_spec import IOSpec
from engine.runtime.decode_device import DeviceRunner
from engine.runtime.decode_gqa import KVBank
from engine.runtime.runner import DecodeRunner, DeviceOptions, bind_array


class GrowingRunner(DecodeRunner):
    """Graphs that concatenate past and new KV: each present OrtValue becomes the next past."""

    path = "growing"

    def __init__(self, session: Any, spec: IOSpec, context_length: int) -> None:
        super().__init__(session, spec, context_length)
        self._binding = session.io_binding()
        self._past: list[Any] = []
        self._positions = np.arange(context_length, dtype=np.int64).reshape(1, -1)
        self._mask = np.ones((1, context_length), dtype=np.int64)
        self._reset_past()

    def _reset_past(self) -> None:
        import onnxruntime as ort

        self._past = [
            ort.OrtValue.ortvalue_from_numpy(
                np.zeros((1, p.num_heads, 0, p.head_dim), dtype=p.dtype))
            for p in self.spec.kv_pairs
        ]

    def _after_rewind(self) -> None:
        import onnxruntime as ort

        if self.length == 0:
            self._reset_past()
            return
        self._past = [
            ort.OrtValue.ortvalue_from_numpy(
                np.ascontiguousarray(v.numpy()[:, :, : self.length]))
            for v in self._past
        ]

    def _kv_views(self) -> list[np.ndarray]:
        return [v.numpy()[0] for v in self._past]

    @property
    def kv_bytes(self) -> int:
        return self.length * self.spec.kv_bytes_per_token

    def _write_kv(self, rows: list[np.ndarray], at: int) -> None:
        # Concatenation graphs own no spare rows: rebuild each past as kept + imported.
        import onnxruntime as ort

        self._past = [
            ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(
                np.concatenate([v.numpy()[:, :, :at], data[None]], axis=2)))
            for v, data in zip(self._past, rows, strict=True)
        ]

    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray:
        b = self._binding
        total = self.length + n
        ids = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(1, n)
        bind_array(b, self.spec.input_ids, ids, (1, n))
        if self.spec.attention_mask:
            bind_array(b, self.spec.attention_mask, self._mask, (1, total))
        if self.spec.position_ids:
            pos = np.ascontiguousarray(self._positions[:, self.length:total])
            bind_array(b, self.spec.position_ids, pos, (1, n))
        for pair, value in zip(self.spec.kv_pairs, self._past, strict=True):
            b.bind_ortvalue_input(pair.input, value)
            b.bind_output(pair.output, "cpu")
        rows = self._logit_rows(b, n)
        logits = np.empty((1, rows, self._vocab), dtype=self._logits_dtype)
        b.bind_output(self.spec.logits, "cpu", 0, self._logits_dtype, [1, rows, self._vocab],
                      logits.ctypes.data)
        self._bind_hidden(b, n)
        self.session.run_with_iobinding(b)
        outputs = b.get_outputs()
        # Outputs come back in binding order: the KV pairs first, then the logits.
        self._past = list(outputs[: len(self.spec.kv_pairs)])
        return logits


class StaticCacheRunner(DecodeRunner):
    """Fixed-length caches written by position: ping-pong between two buffer sets."""

    path = "static_cache"

    def __init__(self, session: Any, spec: IOSpec, context_length: int) -> None:
        assert spec.static_max_len is not None
        super().__init__(session, spec, min(context_length, spec.static_max_len))
        self._binding = session.io_binding()
        cap = spec.static_max_len
        self._bufs = [
            [np.zeros((1, p.num_heads, cap, p.head_dim), dtype=p.dtype) for p in spec.kv_pairs]
            for _ in range(2)
        ]
        self._current = 0
        self._mask = np.zeros((1, cap), dtype=np.int64)
        self._positions = np.arange(cap, dtype=np.int64).reshape(1, -1)
        self._cap = cap

    def _after_rewind(self) -> None:
        self._mask[0, self.length:] = 0

    def _kv_views(self) -> list[np.ndarray]:
        return [a[0] for a in self._bufs[self._current]]

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for bufs in self._bufs for a in bufs)

    def growth_bytes(self, total_tokens: int) -> int:
        return 0  # preallocated at load

    def _write_kv(self, rows: list[np.ndarray], at: int) -> None:
        super()._write_kv(rows, at)
        n = rows[0].shape[1] if rows else 0
        self._mask[0, :at + n] = 1
        self._mask[0, at + n:] = 0

    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray:
        b = self._binding
        total = self.length + n
        ids = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(1, n)
        bind_array(b, self.spec.input_ids, ids, (1, n))
        self._mask[0, self.length:total] = 1
        assert self.spec.attention_mask is not None
        bind_array(b, self.spec.attention_mask, self._mask, (1, self._cap))
        if self.spec.position_ids:
            pos = np.ascontiguousarray(self._positions[:, self.length:total])
            bind_array(b, self.spec.position_ids, pos, (1, n))
        src, dst = self._bufs[self._current], self._bufs[1 - self._current]
        for pair, past, present in zip(self.spec.kv_pairs, src, dst, strict=True):
            bind_array(b, pair.input, past, past.shape)
            b.bind_output(pair.output, "cpu", 0, present.dtype, list(present.shape),
                          present.ctypes.data)
        rows = self._logit_rows(b, n)
        logits = np.empty((1, rows, self._vocab), dtype=self._logits_dtype)
        b.bind_output(self.spec.logits, "cpu", 0, self._logits_dtype, [1, rows, self._vocab],
                      logits.ctypes.data)
        self._bind_hidden(b, n)
        self.session.run_with_iobinding(b)
        self._current = 1 - self._current
        return logits


class RecomputeRunner(DecodeRunner):
    """Graphs without a KV cache: every step runs the whole sequence again."""

    path = "recompute"
    transfers_kv = False

    def __init__(self, session: Any, spec: IOSpec, context_length: int) -> None:
        super().__init__(session, spec, context_length)
        self._tokens = np.zeros(context_length, dtype=np.int64)

    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray:
        total = self.length + n
        self._tokens[self.length:total] = token_ids
        feeds: dict[str, np.ndarray] = {self.spec.input_ids: self._tokens[None, :total]}
        if self.spec.attention_mask:
            feeds[self.spec.attention_mask] = np.ones((1, total), dtype=np.int64)
        if self.spec.position_ids:
            feeds[self.spec.position_ids] = np.arange(total, dtype=np.int64)[None]
        if self.spec.logits_to_keep:
            feeds[self.spec.logits_to_keep] = np.array([self._rows_kept(n)])
        if self.hidden_output is None:
            (logits,) = self.session.run([self.spec.logits], feeds)
        else:
            logits, hidden = self.session.run([self.spec.logits, self.hidden_output], feeds)
            self.last_hidden = np.asarray(hidden, dtype=np.float32)[0, -n:]
        return np.asarray(logits)[:, -n:] if not self.spec.logits_last_only else logits


def runner_factory(session: Any, spec: IOSpec, context_length: int,
                   max_runners: int, device: DeviceOptions | None = None,
                   may_grow: Callable[[int], bool] | None = None
                   ) -> Callable[[], DecodeRunner]:
    """A maker of up to `max_runners` runners on one session. Shared-buffer runners are rows
    of one KV bank, so their decode steps can run as one batch; with `device` they are
    single sequences whose KV stays on that device (engine.decode_device). `may_grow`
    (bytes -> bool) lets the bank grow with headroom where memory allows."""
    if spec.decode_path == "shared_buffer" and device is not None:
        return lambda: DeviceRunner(session, spec, context_length, device)
    if spec.decode_path == "shared_buffer":
        return KVBank(session, spec, context_length, max_rows=max_runners,
                      may_grow=may_grow).add_runner
    kinds: dict[str, type[DecodeRunner]] = {
        "growing": GrowingRunner, "static_cache": StaticCacheRunner,
        "recompute": RecomputeRunner}
    kind = kinds[spec.decode_path]
    return lambda: kind(session, spec, context_length)
