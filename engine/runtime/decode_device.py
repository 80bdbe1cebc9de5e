"""Device-resident shared-buffer KV for GroupQueryAttention graphs (CUDA; the CPU in tests).

The KV buffers, the step's input ids, the mask and the logits are ONNX Runtime OrtValues
on the runner's device, bound once through IOBinding; past and present are the same
buffer, so GQA appends in place and KV never crosses to the host while decoding. A greedy
step runs a tiny second session (`ArgMax` over the device logits) and only the token id
(8 bytes) comes back; full logits are copied to the host only by `forward`, i.e. when a
processor chain or sampler needs them. KV reaches the host only on export/import (prefix
cache, KV store) and when the buffers grow; `host_copy_bytes` counts it.

With `static_shapes` every single-token step has the same shapes and addresses: the mask
is the whole capacity (ones for the valid tokens, zeros after; GQA reads each row's length
from the mask's sum), which is what a captured CUDA graph needs. Prefill and multi-token
steps use their own binding and are never captured (`gpu_graph_id=-1`).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from engine.errors import ContextOverflowError
from engine.model.io_spec import IOSpec
from engine.runtime.runner import GROW_STEP, DecodeRunner, DeviceOptions, bind_array

#: Capacity preallocated for a captured graph when `kv_max_len` does not say (the seed's).
DEFAULT_STATIC_CAPACITY = 4096


def _ort() -> Any:
    import onnxruntime as ort

    return ort


#: One-node models ``token[b, n] = ArgMax(logits[b, n, :])`` (opset 13, ties: the lowest id,
#: as numpy's argmax), serialized once so that the runtime needs no ``onnx`` package (the
#: frozen app leaves it out). tests/engine/runtime/test_decode_device.py rebuilds them with
#: onnx.helper and checks they are these bytes.
_ARGMAX_B64 = {
    "float32": "CAg6tQEKWAoGbG9naXRzEgV0b2tlbiIGQXJnTWF4KhQKBGF4aXMY////////////AaABAioPCghrZW"
               "VwZGltcxgAoAECKhgKEXNlbGVjdF9sYXN0X2luZGV4GACgAQISDWdyZWVkeV9hcmdtYXhaKQoGbG9n"
               "aXRzEh8KHQgBEhkKBxIFYmF0Y2gKBRIDc2VxCgcSBXZvY2FiYh8KBXRva2VuEhYKFAgHEhAKBxIFYm"
               "F0Y2gKBRIDc2VxQgQKABAN",
    "float16": "CAg6tQEKWAoGbG9naXRzEgV0b2tlbiIGQXJnTWF4KhQKBGF4aXMY////////////AaABAioPCghrZW"
               "VwZGltcxgAoAECKhgKEXNlbGVjdF9sYXN0X2luZGV4GACgAQISDWdyZWVkeV9hcmdtYXhaKQoGbG9n"
               "aXRzEh8KHQgKEhkKBxIFYmF0Y2gKBRIDc2VxCgcSBXZvY2FiYh8KBXRva2VuEhYKFAgHEhAKBxIFYm"
               "F0Y2gKBRIDc2VxQgQKABAN",
}


def argmax_model_bytes(logits_dtype: str) -> bytes:
    """The ArgMax model for float16 logits, else for float32."""
    return base64.b64decode(_ARGMAX_B64["float16" if logits_dtype == "float16" else "float32"])


class DeviceArgMax:
    """Greedy on the device: ArgMax over device logits, only the id comes to the host."""

    def __init__(self, providers: list[Any], logits_dtype: str, options: DeviceOptions) -> None:
        ort = _ort()
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(argmax_model_bytes(logits_dtype), so,
                                            providers=providers)
        self._binding = self.session.io_binding()
        self._token = ort.OrtValue.ortvalue_from_shape_and_type(
            [1, 1], np.int64, options.device, options.device_id)

    def token(self, logits: Any) -> int:
        """The argmax of a `[1, 1, V]` device OrtValue."""
        b = self._binding
        b.bind_ortvalue_input("logits", logits)
        b.bind_ortvalue_output("token", self._token)
        self.session.run_with_iobinding(b)
        return int(self._token.numpy()[0, 0])


class DeviceRunner(DecodeRunner):
    """One sequence whose shared KV buffer lives on the device (see the module's text)."""

    path = "shared_buffer"

    def __init__(self, session: Any, spec: IOSpec, context_length: int,
                 options: DeviceOptions) -> None:
        super().__init__(session, spec, context_length)
        self.options = options
        ort = _ort()
        self._value = ort.OrtValue
        dev, did = options.device, options.device_id
        self._ids = self._value.ortvalue_from_shape_and_type([1, 1], np.int64, dev, did)
        self._pos = self._value.ortvalue_from_shape_and_type([1, 1], np.int64, dev, did)
        self._logits = self._value.ortvalue_from_shape_and_type(
            [1, 1, self._vocab], self._logits_dtype, dev, did)
        self._argmax = DeviceArgMax(session.get_providers(), spec.logits_dtype, options)
        self._step = session.io_binding()
        self._multi = session.io_binding()
        self._keep_step = np.ones(1, dtype=np.int64)  # logits_to_keep of a single-token step
        self._step_opts = ort.RunOptions()
        self._multi_opts = ort.RunOptions()
        if options.graph:
            self._multi_opts.add_run_config_entry("gpu_graph_id", "-1")
        self._graph_id = 0
        self._kv: list[Any] = []
        self._host_keep: list[np.ndarray] = []  # arrays that CPU OrtValues alias
        self._cap = 0
        #: KV bytes copied between host and device (export, import, growth), never decode.
        self.host_copy_bytes = 0
        #: Why a graph could not be captured at run time (steps then run eagerly).
        self.capture_failure: str | None = None
        first = min(DEFAULT_STATIC_CAPACITY if options.static_shapes else GROW_STEP,
                    context_length)
        self._allocate(first)

    # --- buffers --------------------------------------------------------------------

    def _device_value(self, host: np.ndarray) -> Any:
        if self.options.device == "cpu":
            self._host_keep.append(host)  # ortvalue_from_numpy aliases host memory
        return self._value.ortvalue_from_numpy(host, self.options.device,
                                               self.options.device_id)

    def _allocate(self, cap: int) -> None:
        """(Re)allocate the KV at `cap` tokens, keeping the cached rows; rebind the step."""
        old = self._host_kv(self.length) if self._kv and self.length else None
        self._host_keep = []
        kv = []
        for i, pair in enumerate(self.spec.kv_pairs):
            host = np.zeros((1, pair.num_heads, cap, pair.head_dim), dtype=pair.dtype)
            if old is not None:
                host[0, :, :self.length] = old[i]
            kv.append(self._device_value(host))
        self._kv, self._cap = kv, cap
        self._ones = self._device_value(np.ones((1, cap), dtype=np.int64))
        self._mask_host = np.zeros((1, cap), dtype=np.int64)
        self._mask = self._device_value(self._mask_host.copy())
        if self.options.graph and self.capture_failure is None:  # new addresses: new graph
            self._graph_id += 1
            self._step_opts = _ort().RunOptions()
            self._step_opts.add_run_config_entry("gpu_graph_id", str(self._graph_id))
        self._bind_step()

    def _bind_step(self) -> None:
        b = self._step
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        for pair, value in zip(self.spec.kv_pairs, self._kv, strict=True):
            b.bind_ortvalue_input(pair.input, value)
            b.bind_ortvalue_output(pair.output, value)  # the same buffer: in place
        b.bind_ortvalue_input(self.spec.input_ids, self._ids)
        if self.spec.position_ids:
            b.bind_ortvalue_input(self.spec.position_ids, self._pos)
        b.bind_ortvalue_output(self.spec.logits, self._logits)
        if self.spec.logits_to_keep:  # a host input: the rewrite is made on the CPU only
            bind_array(b, self.spec.logits_to_keep, self._keep_step, (1,))
        if self.spec.attention_mask and self.options.static_shapes:
            b.bind_ortvalue_input(self.spec.attention_mask, self._mask)
        self._bind_hidden(b, 1)

    def _host_kv(self, end: int) -> list[np.ndarray]:
        """Per pair `[heads, end, head_dim]` host copies (counted in host_copy_bytes)."""
        rows = [np.array(v.numpy()[0, :, :end]) for v in self._kv]
        self.host_copy_bytes += sum(r.nbytes for r in rows)
        return rows

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def kv_bytes(self) -> int:
        return self._cap * self.spec.kv_bytes_per_token

    @property
    def kv_device(self) -> str:
        """Where the KV lives, as ONNX Runtime says ("Cpu", "Cuda")."""
        return str(self._kv[0].device_name()) if self._kv else self.options.device

    def growth_bytes(self, total_tokens: int) -> int:
        if total_tokens <= self._cap:
            return 0
        return (self._grown_cap(total_tokens) - self._cap) * self.spec.kv_bytes_per_token

    def _grown_cap(self, total_tokens: int) -> int:
        return min(-(-total_tokens // GROW_STEP) * GROW_STEP, self.context_length)

    def reserve(self, total_tokens: int) -> None:
        super().reserve(total_tokens)
        if total_tokens > self._cap:
            self._allocate(self._grown_cap(total_tokens))

    # --- KV transfer (prefix cache, KV store): through the host, never during decode ---

    def export_kv(self, start: int, end: int) -> list[np.ndarray]:
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"cannot export rows {start}..{end} of {self.length}")
        return [np.ascontiguousarray(r[:, start:end]) for r in self._host_kv(end)]

    def _write_kv(self, rows: list[np.ndarray], at: int) -> None:
        n = rows[0].shape[1] if rows else 0
        for value, data in zip(self._kv, rows, strict=True):
            host = np.array(value.numpy())
            host[0, :, at:at + n] = data
            value.update_inplace(host)
            self.host_copy_bytes += host.nbytes

    # --- steps ----------------------------------------------------------------------

    def _run_step(self, token: int) -> None:
        """One token at `length`: every buffer bound once, only ids and mask updated."""
        if self.length + 1 > self._cap:
            self.reserve(self.length + 1)
        total = self.length + 1
        self._ids.update_inplace(np.array([[token]], dtype=np.int64))
        b = self._step
        if self.spec.attention_mask:
            if self.options.static_shapes:
                self._mask_host[0, :total] = 1
                self._mask_host[0, total:] = 0
                self._mask.update_inplace(self._mask_host)
            else:
                b.bind_input(self.spec.attention_mask, self.options.device,
                             self.options.device_id, np.int64, [1, total],
                             self._ones.data_ptr())
        if self.spec.position_ids:
            self._pos.update_inplace(np.array([[self.length]], dtype=np.int64))
        try:
            self.session.run_with_iobinding(b, self._step_opts)
        except Exception as exc:  # ORT raises several types when a capture fails
            if not self.options.graph or self.capture_failure is not None:
                raise
            self.capture_failure = str(exc) or type(exc).__name__
            self._step_opts = self._multi_opts  # gpu_graph_id=-1: eager from now on
            self.session.run_with_iobinding(b, self._step_opts)

    def _run_multi(self, token_ids: np.ndarray, n: int) -> Any:
        """Several tokens (prefill, verify): own binding, never captured; device logits."""
        if self.length + n > self._cap:
            self.reserve(self.length + n)
        total = self.length + n
        b = self._multi
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        for pair, value in zip(self.spec.kv_pairs, self._kv, strict=True):
            b.bind_ortvalue_input(pair.input, value)
            b.bind_ortvalue_output(pair.output, value)
        ids = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(1, n)
        b.bind_ortvalue_input(self.spec.input_ids, self._device_value(ids))
        if self.spec.attention_mask:
            b.bind_input(self.spec.attention_mask, self.options.device, self.options.device_id,
                         np.int64, [1, total], self._ones.data_ptr())
        if self.spec.position_ids:
            pos = np.arange(self.length, total, dtype=np.int64).reshape(1, n)
            b.bind_ortvalue_input(self.spec.position_ids, self._device_value(pos))
        rows = self._logit_rows(b, n)
        logits = self._value.ortvalue_from_shape_and_type(
            [1, rows, self._vocab], self._logits_dtype, self.options.device,
            self.options.device_id)
        b.bind_ortvalue_output(self.spec.logits, logits)
        self._bind_hidden(b, n)
        self.session.run_with_iobinding(b, self._multi_opts)
        return logits

    def _run(self, token_ids: np.ndarray, n: int) -> np.ndarray:
        if n == 1:
            self._run_step(int(token_ids[0]))
            return np.asarray(self._logits.numpy())  # the logits cross: a processor wants them
        return np.asarray(self._run_multi(token_ids, n).numpy())

    def forward_greedy(self, token_ids: np.ndarray) -> int:
        """One token in, the argmax of its logits out, computed on the device."""
        if int(token_ids.shape[0]) != 1:
            return super().forward_greedy(token_ids)
        if self.length + 1 > self.context_length:
            raise ContextOverflowError(
                f"{self.length + 1} tokens exceed the model's context of "
                f"{self.context_length}", hint="the generation loop must stop at the context")
        token = int(token_ids[0])
        self._run_step(token)
        self.length += 1
        self.tokens.append(token)
        return self._argmax.token(self._logits)
