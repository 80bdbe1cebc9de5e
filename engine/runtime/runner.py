"""What every decode runner is: one ORT session, its KV state, and a `forward(token_ids)` step.

Every runner keeps `length` tokens of KV, appends on `forward`, and drops the tail on
`rewind`. The implementations (`engine.runtime.decode`, `decode_gqa`, `decode_device`) sit
above this module; the engine, the scheduler and the KV code see only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ContextOverflowError
from engine.model.io_spec import IOSpec

#: KV buffers grow in steps of this many tokens (never the whole context up front).
GROW_STEP = 64
#: A sliding window drops this share of its tokens at once (engine.kv.window).
DROP_SHARE = 8


@dataclass(frozen=True)
class WindowSpec:
    """A declared sliding window (engine.kv.window): the first `sinks` tokens and at most
    `window` recent ones keep their KV."""

    sinks: int
    window: int

    @property
    def rows(self) -> int:
        """The most KV rows the runner holds."""
        return self.sinks + self.window

    @property
    def drop(self) -> int:
        """Tokens that leave together when the rows are full."""
        return max(1, self.window // DROP_SHARE)

    def as_dict(self) -> dict[str, int]:
        return {"attention_sinks": self.sinks, "sliding_window": self.window,
                "drop": self.drop, "kv_rows": self.rows}


@dataclass(frozen=True)
class DeviceOptions:
    #: ONNX Runtime device type of the buffers: "cuda", or "cpu" (same code path, tests).
    device: str = "cpu"
    device_id: int = 0
    #: Single-token steps keep one shape (a full-capacity mask): required for capture.
    static_shapes: bool = False
    #: The session was made with `enable_cuda_graph`: single-token steps replay a graph.
    graph: bool = False


def bind_array(binding: Any, name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """Bind a host array (or a leading part of it) without creating an OrtValue."""
    binding.bind_input(name, "cpu", 0, array.dtype, list(shape), array.ctypes.data)


class DecodeRunner(ABC):
    """A model session plus its KV cache for one sequence."""

    path: str = ""
    #: The sliding window this runner keeps (engine.kv.window); None: every token's KV.
    window: WindowSpec | None = None

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
        self._keep = np.ones(1, dtype=np.int64)  # the graph's logits_to_keep, bound by pointer
        self._all_logits = False

    def track_hidden(self, name: str, size: int) -> None:
        """Fetch the graph output `name` (`[1, n, size]` float32) with every forward."""
        self.hidden_output, self._hidden_size = name, size

    def _logit_rows(self, binding: Any, n: int) -> int:
        """Rows of logits a run of `n` tokens returns: the last only where the graph is
        pruned to it, or where it takes `logits_to_keep` and the caller wants the last
        (then the input is bound here); `n` otherwise."""
        if self.spec.logits_last_only:
            return 1
        if self.spec.logits_to_keep is None:
            return n
        self._keep[0] = self._rows_kept(n)
        bind_array(binding, self.spec.logits_to_keep, self._keep, (1,))
        return int(self._keep[0])

    def _rows_kept(self, n: int) -> int:
        """The `logits_to_keep` value for a run of `n` tokens: all of them when the
        caller asked for every row, else the last."""
        return n if self._all_logits else 1

    def _bind_hidden(self, binding: Any, n: int) -> None:
        """Bind a fresh `[1, n, hidden]` buffer as the hidden output (when tracked)."""
        if self.hidden_output is not None:
            hidden = np.empty((1, n, self._hidden_size), dtype=np.float32)
            binding.bind_output(self.hidden_output, "cpu", 0, np.float32, list(hidden.shape),
                                hidden.ctypes.data)
            self.last_hidden = hidden[0]

    @property
    def kv_runner(self) -> DecodeRunner:
        """The runner whose buffers hold the KV (itself; a window's inner runner)."""
        return self

    @property
    def exact_length(self) -> int:
        """Leading rows whose KV is what a fresh computation of `tokens` gives there: the
        rows the prefix cache, sessions and the store may keep (all, but for a window)."""
        return self.length

    def reachable(self, length: int) -> int:
        """The longest length up to `length` that `rewind` can go back to."""
        return length

    def room_ahead(self) -> int:
        """Tokens one forward may take without going back past where it started
        becoming impossible (a window drops its oldest tokens at fixed points)."""
        return self.context_length - self.length

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
        self._all_logits = all_logits
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
