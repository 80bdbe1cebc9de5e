"""Decode runners: one ORT session, its KV state, and a `forward(token_ids)` step.

Every runner keeps `length` tokens of KV, appends on `forward`, and drops the tail on
`rewind`. The per-token path is kept lean: buffers are bound once and inputs are updated
in place, because Python overhead per step is what separates a loop from a C++ peer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import ContextOverflowError
from engine.io_spec import IOSpec

if TYPE_CHECKING:
    from engine.decode_device import DeviceOptions


def bind_array(binding: Any, name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """Bind a host array (or a leading part of it) without creating an OrtValue."""
    binding.bind_input(name, "cpu", 0, array.dtype, list(shape), array.ctypes.data)


class DecodeRunner(ABC):
    """A model session plus its KV cache for one sequence."""

    path: str = ""

    def __init__(self, session: Any, spec: IOSpec, context_length: int) -> None:
        self.session = session
        self.spec = spec
        self.context_length = context_length
        self.length = 0
        #: The token ids whose KV the runner holds (len == length).
        self.tokens: list[int] = []
        self._vocab = spec.vocab_size
        self._logits_dtype = np.float16 if spec.logits_dtype == "float16" else np.float32
        #: A float32 hidden-state output fetched with the logits (for an MTP head), if any.
        self.hidden_output: str | None = None
        self._hidden_size = 0
        #: `[n, hidden]` rows of the last forward when `hidden_output` is set.
        self.last_hidden: np.ndarray | None = None

    def track_hidden(self, name: str, size: int) -> None:
        """Fetch the graph output `name` (`[1, n, size]` float32) with every forward."""
        self.hidden_output, self._hidden_size = name, size

    def _bind_hidden(self, binding: Any, n: int) -> None:
        """Bind a fresh `[1, n, hidden]` buffer as the hidden output (when tracked)."""
        if self.hidden_output is not None:
            hidden = np.empty((1, n, self._hidden_size), dtype=np.float32)
            binding.bind_output(self.hidden_output, "cpu", 0, np.float32, list(hidden.shape),
                                hidden.ctypes.data)
            self.last_hidden = hidden[0]

    @property
    def capacity(self) -> int:
        """Tokens the KV can hold without reallocation."""
        return self.context_length

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV this runner holds now."""
        return 0

    def growth_bytes(self, total_tokens: int) -> int:
        """Bytes `reserve(total_tokens)` would add (before anything is allocated)."""
        return max(0, total_tokens - self.length) * self.spec.kv_bytes_per_token

    def reserve(self, total_tokens: int) -> None:
        """Make room for `total_tokens` in all (prompt + generated); may reallocate."""
        if total_tokens > self.context_length:
            raise ContextOverflowError(
                f"{total_tokens} tokens do not fit the model's context of "
                f"{self.context_length}", hint="shorten the prompt or ask for fewer tokens")

    def forward(self, token_ids: np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Run `token_ids` (int64, 1-D) after the cached ones; return float32 logits.

        Returns `[V]` for the last position, or `[n, V]` with `all_logits` (not possible
        on graphs that output last-token logits only). The array may be a view that the
        next call overwrites.
        """
        n = int(token_ids.shape[0])
        if n == 0:
            raise ValueError("forward needs at least one token")
        if self.length + n > self.context_length:
            raise ContextOverflowError(
                f"{self.length + n} tokens exceed the model's context of "
                f"{self.context_length}", hint="the generation loop must stop at the context")
        if all_logits and self.spec.logits_last_only and n > 1:
            raise ValueError("this graph outputs last-token logits only")
        logits = self._run(token_ids, n)
        self.length += n
        self.tokens.extend(token_ids.tolist())
        rows = logits.reshape(-1, self._vocab)
        if rows.dtype != np.float32:
            rows = rows.astype(np.float32)
        return rows if all_logits else rows[-1]

    def forward_greedy(self, token_ids: np.ndarray) -> int:
        """`forward`, then the argmax of the last position (ties: the lowest id). Runners
        that keep logits on a device override it so only the token id crosses."""
        return int(np.argmax(self.forward(token_ids)))

    def rewind(self, n: int) -> None:
        """Forget the last `n` tokens."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot rewind {n} of {self.length} tokens")
        self.length -= n
        del self.tokens[self.length:]
        self._after_rewind()

    def reset(self) -> None:
        self.rewind(self.length)

    #: Whether `export_kv` / `import_kv` work (a graph without KV has nothing to move).
    transfers_kv = True

    def export_kv(self, start: int, end: int) -> list[np.ndarray]:
        """Copies of the cached KV rows `[start, end)`: per pair `[heads, n, head_dim]`."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"cannot export rows {start}..{end} of {self.length}")
        return [np.array(view[:, start:end]) for view in self._kv_views()]

    def import_kv(self, rows: list[np.ndarray], at: int, token_ids: Sequence[int]) -> None:
        """Make rows `[at, at + n)` hold `rows`, the KV of `token_ids`."""
        if not 0 <= at <= self.length:
            raise ValueError(f"cannot import at {at}: only {self.length} rows are cached")
        n = rows[0].shape[1] if rows else 0
        if len(token_ids) != n:
            raise ValueError(f"{n} rows of KV for {len(token_ids)} tokens")
        self.reserve(at + n)
        self.length = at
        del self.tokens[at:]
        self._write_kv(rows, at)
        self.length = at + n
        self.tokens.extend(token_ids)

    def _kv_views(self) -> list[np.ndarray]:
        """Per-pair `[heads, capacity, head_dim]` views of the live KV."""
        raise NotImplementedError

    def _write_kv(self, rows: list[np.ndarray], at: int) -> None:
        for view, data in zip(self._kv_views(), rows, strict=True):
            view[:, at:at + data.shape[1]] = data

    def _after_rewind(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Hook for runners whose KV must be trimmed on rewind."""

    @abstractmethod
    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray: ...


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
        rows = 1 if self.spec.logits_last_only else n
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
        rows = 1 if self.spec.logits_last_only else n
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
        if self.hidden_output is None:
            (logits,) = self.session.run([self.spec.logits], feeds)
        else:
            logits, hidden = self.session.run([self.spec.logits, self.hidden_output], feeds)
            self.last_hidden = np.asarray(hidden, dtype=np.float32)[0, -n:]
        return np.asarray(logits)[:, -n:] if not self.spec.logits_last_only else logits


def runner_factory(session: Any, spec: IOSpec, context_length: int,
                   max_runners: int, device: DeviceOptions | None = None
                   ) -> Callable[[], DecodeRunner]:
    """A maker of up to `max_runners` runners on one session. Shared-buffer runners are rows
    of one KV bank, so their decode steps can run as one batch; with `device` they are
    single sequences whose KV stays on that device (engine.decode_device)."""
    if spec.decode_path == "shared_buffer" and device is not None:
        from engine.decode_device import DeviceRunner

        return lambda: DeviceRunner(session, spec, context_length, device)
    if spec.decode_path == "shared_buffer":
        from engine.decode_gqa import KVBank

        return KVBank(session, spec, context_length, max_rows=max_runners).add_runner
    kinds: dict[str, type[DecodeRunner]] = {
        "growing": GrowingRunner, "static_cache": StaticCacheRunner,
        "recompute": RecomputeRunner}
    kind = kinds[spec.decode_path]
    return lambda: kind(session, spec, context_length)
