"""Shared-buffer KV for GroupQueryAttention graphs, several sequences in one bank.

Past and present are one preallocated buffer per KV pair, `[rows, heads, cap, head_dim]`;
a sequence owns a row. GQA writes the new rows in place (it shares past and present when
they are the same pointer), the mask's length is the total length and each row's sum is
that row's own length, so sequences of different lengths decode together in one run:
concurrent users share one read of the weights. Capacity grows by reallocation, never to
the whole context up front: to what the request needs plus an eighth, or a quarter more
than it held, where the governor has room (an editor's prompt grows a token or two per
keystroke, and each reallocation copies the whole bank: with exact steps, one completion
in ten paid ~60 ms for it on a 2,000-token file).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.model.io_spec import IOSpec
from engine.runtime.runner import GROW_STEP, DecodeRunner, bind_array


class KVBank:
    """The KV buffers of up to `max_rows` sequences of one model."""

    #: Growth beyond the exact step: to a quarter more than the capacity held, and at
    #: least an eighth more than the request needs (so an editor's first completion on a
    #: file leaves room for the next keystrokes' prompts).
    HEADROOM = 0.25

    def __init__(self, session: Any, spec: IOSpec, context_length: int, max_rows: int,
                 may_grow: Callable[[int], bool] | None = None) -> None:
        self.session = session
        #: Asked before growing by more than needed (bytes beyond the capacity held):
        #: the governor's room. None: never more than needed.
        self.may_grow = may_grow
        self.spec = spec
        self.context_length = context_length
        self.max_rows = max_rows
        self.kv: list[np.ndarray] = []
        self.cap = 0
        self.generation = 0  # bumped on reallocation: runners rebind their pointers
        self.runners: list[SharedBufferRunner] = []
        self._binding = session.io_binding()
        self._bound: tuple[int, int] | None = None  # (rows, generation) the KV is bound for
        vocab = spec.vocab_size
        self._logits_dtype = np.float16 if spec.logits_dtype == "float16" else np.float32
        self._ids = np.zeros((max_rows, 1), dtype=np.int64)
        self._keep_one = np.ones(1, dtype=np.int64)  # logits_to_keep of a decode step
        self._logits = np.empty((max_rows, 1, vocab), dtype=self._logits_dtype)
        self._arange = np.arange(context_length, dtype=np.int64)
        # rows x total, contiguous at the front of one buffer whose address is resolved once
        self._mask = np.zeros(max_rows * context_length, dtype=np.int64)
        self._mask_ptr = self._mask.ctypes.data
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def add_runner(self, initial_capacity: int = GROW_STEP) -> SharedBufferRunner:
        if len(self.runners) >= self.max_rows:
            raise ValueError(f"the bank holds at most {self.max_rows} sequences")
        runner = SharedBufferRunner(self, len(self.runners))
        self.runners.append(runner)
        self.resize(len(self.runners), max(self.cap, min(initial_capacity,
                                                         self.context_length)))
        return runner

    def growth_bytes(self, total_tokens: int) -> int:
        if total_tokens <= self.cap:
            return 0
        cap = min(-(-total_tokens // GROW_STEP) * GROW_STEP, self.context_length)
        return len(self.runners) * (cap - self.cap) * self.spec.kv_bytes_per_token

    def shrink(self) -> int:
        """Fit the buffers to the longest cached row (idle memory goes back); bytes freed."""
        before = self.nbytes
        longest = max((r.length for r in self.runners), default=0)
        cap = max(GROW_STEP, -(-longest // GROW_STEP) * GROW_STEP)
        if cap < self.cap:
            self.resize(len(self.runners), cap)
        return before - self.nbytes

    def reserve(self, total_tokens: int) -> None:
        if total_tokens > self.cap:
            target = min(-(-total_tokens // GROW_STEP) * GROW_STEP, self.context_length)
            want = max(self.cap * (1 + self.HEADROOM), target * (1 + self.HEADROOM / 2))
            roomy = min(-(-int(want) // GROW_STEP) * GROW_STEP, self.context_length)
            if roomy > target and self.may_grow is not None and self.may_grow(
                    len(self.runners) * (roomy - self.cap) * self.spec.kv_bytes_per_token):
                target = roomy
            self.resize(len(self.runners), target)

    def resize(self, rows: int, cap: int) -> None:
        """Reallocate to `rows` x `cap`, keeping every row's cached tokens."""
        new = [np.zeros((rows, p.num_heads, cap, p.head_dim), p.dtype)
               for p in self.spec.kv_pairs]
        for i, buf in enumerate(new):
            for runner in self.runners[: min(rows, len(self.kv[i]) if self.kv else 0)]:
                buf[runner.row, :, : runner.length] = self.kv[i][runner.row, :, : runner.length]
        self.kv, self.cap = new, cap
        self._nbytes = sum(a.nbytes for a in new)
        self.generation += 1

    def forward_batch(self, runners: Sequence[SharedBufferRunner],
                      tokens: Sequence[int]) -> np.ndarray:
        """One decode step for several rows at once: `[len(runners), V]` logits (a view)."""
        hi = max(r.row for r in runners) + 1
        lengths = np.array([r.length for r in self.runners[:hi]], dtype=np.int64)
        if int(lengths.max()) + 1 > self.cap:
            self.reserve(int(lengths.max()) + 1)
        # Rows not in this step decode a dummy token at their own end: GQA writes it past
        # their valid length, where nothing reads it.
        self._ids[:hi, 0] = 0
        for runner, token in zip(runners, tokens, strict=True):
            self._ids[runner.row, 0] = token
        total = int(lengths.max()) + 1
        np.less(self._arange[:total], (lengths + 1)[:, None],
                out=self._mask[: hi * total].reshape(hi, total), casting="unsafe")
        b = self._binding
        if self._bound != (hi, self.generation):  # KV, ids and logits: bound once per shape
            for pair, buf in zip(self.spec.kv_pairs, self.kv, strict=True):
                shape = (hi, *buf.shape[1:])
                bind_array(b, pair.input, buf, shape)
                b.bind_output(pair.output, "cpu", 0, buf.dtype, list(shape), buf.ctypes.data)
            bind_array(b, self.spec.input_ids, self._ids, (hi, 1))
            if self.spec.logits_to_keep:
                bind_array(b, self.spec.logits_to_keep, self._keep_one, (1,))
            b.bind_output(self.spec.logits, "cpu", 0, self._logits_dtype,
                          [hi, 1, self.spec.vocab_size], self._logits.ctypes.data)
            self._bound = (hi, self.generation)
        if self.spec.attention_mask:
            b.bind_input(self.spec.attention_mask, "cpu", 0, np.int64, [hi, total],
                         self._mask_ptr)
        if self.spec.position_ids:
            pos = np.ascontiguousarray(lengths[:, None])
            bind_array(b, self.spec.position_ids, pos, (hi, 1))
        self.session.run_with_iobinding(b)
        for runner, token in zip(runners, tokens, strict=True):
            runner.length += 1
            runner.tokens.append(int(token))
        rows = [r.row for r in runners]
        if rows == list(range(hi)):  # every row, in order: a view, no copy of [rows, V]
            return self._logits[:hi, 0].astype(np.float32, copy=False)
        return self._logits[rows, 0].astype(np.float32, copy=False)


class SharedBufferRunner(DecodeRunner):
    """One row of a KVBank: a sequence whose KV is appended in place, O(1) per token."""

    path = "shared_buffer"

    def __init__(self, bank: KVBank, row: int) -> None:
        super().__init__(bank.session, bank.spec, bank.context_length)
        self.bank = bank
        self.row = row
        self._binding = bank.session.io_binding()
        self._bound_generation = -1
        self._mask = np.ones((1, bank.context_length), dtype=np.int64)
        self._step_ids = np.zeros((1, 1), dtype=np.int64)
        self._step_logits = np.empty((1, 1, self._vocab), dtype=self._logits_dtype)
        self._positions = np.arange(bank.context_length, dtype=np.int64).reshape(1, -1)
        self._step_bound = False
        self._mask_ptr = 0

    @property
    def capacity(self) -> int:
        return self.bank.cap

    @property
    def kv_bytes(self) -> int:
        return self.bank.nbytes // len(self.bank.runners)  # rows are equal: its own row

    def _kv_views(self) -> list[np.ndarray]:
        return [a[self.row] for a in self.bank.kv]

    def reserve(self, total_tokens: int) -> None:
        super().reserve(total_tokens)
        self.bank.reserve(total_tokens)

    def growth_bytes(self, total_tokens: int) -> int:
        return self.bank.growth_bytes(total_tokens)

    def _bind_kv(self) -> None:
        # Past and present are the same pointer: GQA appends in place.
        b = self._binding
        for pair, buf in zip(self.spec.kv_pairs, self.bank.kv, strict=True):
            row = buf[self.row:self.row + 1]
            bind_array(b, pair.input, row, row.shape)
            b.bind_output(pair.output, "cpu", 0, row.dtype, list(row.shape), row.ctypes.data)
        self._bound_generation = self.bank.generation
        self._mask_ptr = self._mask.ctypes.data  # resolved once: ctypes access is slow

    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray:
        if self.length + n > self.bank.cap:
            self.reserve(self.length + n)
        if self._bound_generation != self.bank.generation:
            self._bind_kv()
        b = self._binding
        total = self.length + n
        if n == 1:
            if not self._step_bound:
                bind_array(b, self.spec.input_ids, self._step_ids, (1, 1))
                self._logit_rows(b, 1)
                b.bind_output(self.spec.logits, "cpu", 0, self._logits_dtype,
                              [1, 1, self._vocab], self._step_logits.ctypes.data)
                self._bind_hidden(b, 1)  # one buffer for every single-token step
                self._step_bound = True
            self._step_ids[0, 0] = token_ids[0]
            logits = self._step_logits
        else:
            ids = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(1, n)
            rows = self._logit_rows(b, n)
            logits = np.empty((1, rows, self._vocab), dtype=self._logits_dtype)
            bind_array(b, self.spec.input_ids, ids, (1, n))
            b.bind_output(self.spec.logits, "cpu", 0, self._logits_dtype,
                          [1, rows, self._vocab], logits.ctypes.data)
            self._bind_hidden(b, n)
            self._step_bound = False
        if self.spec.attention_mask:
            b.bind_input(self.spec.attention_mask, "cpu", 0, np.int64, [1, total],
                         self._mask_ptr)
        if self.spec.position_ids:
            pos = self._positions[:, self.length:total]
            bind_array(b, self.spec.position_ids, np.ascontiguousarray(pos), (1, n))
        self.session.run_with_iobinding(b)
        return logits
