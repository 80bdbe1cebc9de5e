"""Frozen option dataclasses, validated at construction (the public edge)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.constraint import ConstraintSpec as ConstraintSpec
from engine.constraint import JsonConstraintSpec as JsonConstraintSpec
from engine.errors import InvalidOptionError
from engine.sizes import parse_limit

#: A stop sequence is text (matched on decoded output) or a run of token ids.
StopSequence = str | tuple[int, ...]

PROVIDERS: tuple[str, ...] = ("auto", "cpu", "cuda", "directml")
#: `EngineConfig.kv_dtype`'s values.
KV_DTYPES: tuple[str, ...] = ("auto", "float16", "float32", "int8", "int16")
#: How long ORT's idle threads spin, µs, in the engine and the worker: long enough to bridge
#: the gaps between a decode step's operators (a single-threaded operator between two
#: parallel ones: 5 µs lost 18% of the built-in model's decode on a quiet machine, 10 µs
#: and more kept ORT's own speed at a short prompt, 20 µs 8% below it at 1,900 tokens),
#: short enough that a thread sharing its core with another program sleeps instead of
#: burning its share (ORT's own spin decoded 19-28% slower beside 1-2 busy processes) and
#: that the cores idle right after a request (`python -m bench.spin`, bench/README.md).
SPIN_US = 20


def _check_int(name: str, value: object, *, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOptionError(
            name, f"expected an integer >= {minimum}, got {value!r}", hint=hint
        )


def _check_float(
    name: str, value: object, *, low: float, high: float, low_open: bool = False, hint: str
) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = (v > low if low_open else v >= low) and v <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise InvalidOptionError(
            name, f"expected a number in {bracket}{low}, {high}], got {value!r}", hint=hint
        )


@dataclass(frozen=True)
class GenerateOptions:
    """Everything that shapes one generation. Defaults change nothing (empty processor chain)."""

    max_new_tokens: int = 256
    #: Total tokens (prompt + generated) allowed; None = the model's context length.
    max_context: int | None = None
    #: 0 means greedy.
    temperature: float = 1.0
    greedy: bool = False
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    #: Token id -> additive bias (OpenAI `logit_bias`).
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop_sequences: tuple[StopSequence, ...] = ()
    #: None = the model's EOS ids (all of them count).
    eos_token_ids: tuple[int, ...] | None = None
    stop_on_eos: bool = True
    #: EOS and stop tokens are masked until this many tokens were generated.
    min_new_tokens: int = 0
    #: None = no logprobs; 0 = the chosen token's logprob only; k = plus the top k.
    top_logprobs: int | None = None
    #: Only tokens that keep the output a prefix of the grammar's language (JSON, a
    #: schema, GBNF, a regex); see ``engine.generation.guidance``.
    constraint: ConstraintSpec | None = None
    #: A prompt that does not fit the context is refused unless this is set: then its
    #: oldest tokens are dropped (leaving room for max_new_tokens) and the result says how
    #: many.
    truncate_prompt: bool = False
    #: "prompt_lookup": guess tokens from the prompt and output, verify them in one pass;
    #: "draft_model": guesses of EngineConfig.draft_model; "mtp": the model's declared MTP
    #: head; "auto" (the default): prompt lookup where the output stays plain greedy's bit
    #: for bit (every attention and 4-bit matmul node on the engine's kernels,
    #: Engine.exact_paths) and only while the request runs alone (a batched step is a
    #: plain step), pausing after guesses that fail (docs/speculative.md). Every mode runs
    #: only where it cannot change the output (greedy, no processors, no logprobs, no
    #: custom sampler); with ONNX Runtime's kernels (ONNX_GENAI_KERNELS=0, a GPU) an
    #: explicit mode on int4 MatMulNBits graphs can leave plain greedy's at a near-tie.
    speculative_mode: str = "auto"
    num_speculative_tokens: int = 4
    speculative_ngram: int = 3

    def __post_init__(self) -> None:
        if self.speculative_mode not in ("auto", "none", "prompt_lookup", "draft_model",
                                         "mtp"):
            raise InvalidOptionError("speculative_mode", "expected 'auto', 'none', "
                                     "'prompt_lookup', 'draft_model' or 'mtp', got "
                                     f"{self.speculative_mode!r}",
                                     hint="use 'prompt_lookup' for code edits")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=1,
                   hint="e.g. 4")
        _check_int("speculative_ngram", self.speculative_ngram, minimum=1, hint="e.g. 3")
        _check_int("max_new_tokens", self.max_new_tokens, minimum=1,
                   hint="ask for at least one new token")
        if self.max_context is not None:
            _check_int("max_context", self.max_context, minimum=2,
                       hint="leave it unset to use the model's context length")
        _check_float("temperature", self.temperature, low=0.0, high=100.0,
                     hint="use 0 for greedy decoding, 1 for the model's distribution")
        _check_int("top_k", self.top_k, minimum=0, hint="use 0 to disable top-k")
        _check_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True,
                     hint="use 1.0 to disable nucleus sampling")
        _check_float("min_p", self.min_p, low=0.0, high=1.0, hint="use 0 to disable min-p")
        _check_float("repetition_penalty", self.repetition_penalty, low=0.01, high=100.0,
                     hint="use 1.0 for no penalty; values > 1 discourage repeats")
        for name in ("frequency_penalty", "presence_penalty"):
            _check_float(name, getattr(self, name), low=-2.0, high=2.0,
                         hint="OpenAI's range is -2.0 to 2.0; use 0 for no penalty")
        for token, bias in self.logit_bias.items():
            _check_int("logit_bias", token, minimum=0, hint="keys are token ids")
            _check_float("logit_bias", bias, low=-100.0, high=100.0,
                         hint="biases range from -100 (ban) to 100 (force)")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0, hint="use a non-negative integer")
        for index, stop in enumerate(self.stop_sequences):
            if isinstance(stop, str):
                if not stop:
                    raise InvalidOptionError(f"stop_sequences[{index}]", "empty string",
                                             hint="remove it or give non-empty text")
            elif isinstance(stop, tuple) and stop:
                for token in stop:
                    _check_int(f"stop_sequences[{index}]", token, minimum=0,
                               hint="token stop sequences are tuples of token ids")
            else:
                raise InvalidOptionError(
                    f"stop_sequences[{index}]",
                    f"expected non-empty text or a tuple of token ids, got {stop!r}",
                    hint="e.g. stop_sequences=('\\n\\n', (42, 7))",
                )
        if self.eos_token_ids is not None:
            for token in self.eos_token_ids:
                _check_int("eos_token_ids", token, minimum=0, hint="give token ids")
        _check_int("min_new_tokens", self.min_new_tokens, minimum=0, hint="use 0 to disable")
        if self.top_logprobs is not None:
            _check_int("top_logprobs", self.top_logprobs, minimum=0,
                       hint="use 0 for the chosen token only, up to 20 alternatives")
            if self.top_logprobs > 20:
                raise InvalidOptionError("top_logprobs", f"at most 20, got {self.top_logprobs}",
                                         hint="ask for 20 or fewer alternatives")
        if self.constraint is not None and not isinstance(self.constraint, ConstraintSpec):
            raise InvalidOptionError("constraint", f"expected a ConstraintSpec, got "
                                     f"{type(self.constraint).__name__}",
                                     hint="e.g. ConstraintSpec('json_object')")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0


@dataclass(frozen=True)
class KVStoreConfig:
    """The tiered KV store (RAM then disk) that lets prefixes survive restarts."""

    chunk_tokens: int = 64
    ram_bytes: int = 256 * 1024 * 1024
    disk_bytes: int = 2 * 1024 * 1024 * 1024
    #: None = the user cache dir.
    disk_dir: str | None = None
    #: int8 chunks (4x smaller, lossy) or exact copies; None = int8 only for KV that
    #: leaves a GPU, exact on the CPU, where reuse must stay token-identical.
    quantize: bool | None = None

    def __post_init__(self) -> None:
        _check_int("chunk_tokens", self.chunk_tokens, minimum=1, hint="e.g. 64")
        _check_int("ram_bytes", self.ram_bytes, minimum=0, hint="0 turns the RAM tier off")
        _check_int("disk_bytes", self.disk_bytes, minimum=0, hint="0 turns the disk tier off")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: provider, threads, buffers."""

    provider: str = "auto"
    #: None = the machine's physical cores.
    intra_op_threads: int | None = None
    #: How long idle ORT threads spin before they sleep, in microseconds. The default
    #: (SPIN_US) keeps them awake between the operators of a step and asleep right after
    #: it; None = ONNX Runtime's own spin (long after every request: idle CPU, and slow
    #: while other programs want the cores), 0 = never spin (every parallel operator wakes
    #: sleeping threads). `python -m bench.spin`, bench/README.md.
    spin_duration_us: int | None = SPIN_US
    #: Prompt tokens per prefill forward.
    prefill_chunk_size: int = 512
    #: Cap on the shared KV buffer length (tokens); None = the model's context.
    kv_max_len: int | None = None
    #: KV reserved, when it starts, for an answer bounded by the context alone (a request
    #: without max_tokens): this many tokens after the prompt; the rest is reserved as the
    #: answer grows, ``kv_grow_tokens`` at a time, within the memory limit. An answer whose
    #: growth the limit refuses ends with finish reason ``length``. (An answer bounded by
    #: its max_new_tokens reserves them all when it starts.)
    kv_reserve_ahead: int = 256
    kv_grow_tokens: int = 64
    #: Reuse the KV of earlier prompts (live slot, prefix cache, sessions).
    prefix_cache: bool = True
    #: Reuse by shifting (engine.kv.shift): runs of at least this many cached tokens found
    #: at other positions of a new prompt keep their KV, keys re-rotated (in a prompt under
    #: 8x this, runs of an eighth of it, at least 64); 0 = off (every token after the
    #: common prefix is recomputed: answers exactly as without a cache).
    cache_reuse: int = 256
    #: Context shift (llama.cpp's --context-shift): N > 0 keeps the first N tokens and, when
    #: a sequence fills the context, drops the oldest tokens after them an eighth of the
    #: context at a time, the kept keys re-rotated (engine.kv.window), so prompts and
    #: answers run past the context; 0 = off (a full context ends the answer, ``length``).
    #: Models whose metadata declares a sliding window keep theirs.
    context_shift: int = 0
    #: Tokens per KV page (the granularity of prefix reuse).
    kv_page_size: int = 32
    #: Bytes the page pool (prefix cache + sessions' KV) may hold.
    kv_cache_bytes: int = 512 * 1024 * 1024
    #: Memory limits per tier: "auto", a fraction "0.5", "50%", or bytes "8GiB".
    vram_limit: str = "auto"
    host_ram_limit: str = "auto"
    #: Disk spill for the KV store; None = no disk tier limit (spill off).
    disk_limit: str | None = None
    #: Limits may change while running (the memory slider).
    runtime_override: bool = True
    #: A smaller model with the same tokenizer, for speculative_mode="draft_model".
    draft_model: str | None = None
    #: A model-declared proposer (MTP / EAGLE-3 / shared-KV head) given here instead of in
    #: the model's inference_metadata.yaml: the same mapping as its `speculative:` block,
    #: paths relative to the model folder (see engine.spec_heads). Validated at load.
    speculative_head: Mapping[str, Any] | None = None
    #: Sequences decoded together in one batch (the scheduler's concurrency).
    max_batch: int = 4
    #: Tiered KV store for prefixes across requests and restarts; off unless given.
    kv_store: KVStoreConfig | None = None
    #: KV, inputs and logits as device OrtValues, greedy argmax on the device: None = on
    #: CUDA (shared-buffer graphs), True = also on the CPU (the same code path), False = off.
    device_kv: bool | None = None
    #: CUDA graph capture of decode steps: None = ONNX_GENAI_CUDA_GRAPH (default off).
    #: Declined, with the reason in describe(), unless the graph is structurally safe.
    cuda_graph: bool | None = None
    #: Linux: back the loaded weights with transparent huge pages (engine.hugepages);
    #: decode on the CPU reads every weight per token (bench/README.md has the gain).
    huge_pages: bool = True
    #: CPU: a prefill computes the LM head for its last position only, not every prompt
    #: token (engine.model.graph_passes; the same logits, bench/README.md has the gain).
    prune_logits: bool = True
    #: CPU: GroupQueryAttention graphs run their decode steps in the engine's own kernel
    #: (engine/kernels: each KV head's cache read once for all its query heads, positions
    #: split across the threads); off, or not built, = ONNX Runtime's kernel throughout.
    own_kernels: bool = True
    #: The live KV cache's element type on the CPU: "auto" = 16 bits where the engine's
    #: kernel runs every attention node (engine.model.kv16_pass: half the KV bytes per
    #: token): int16 whole numbers with a scale per row where the CPU has AVX-512 VNNI or
    #: AVX-VNNI and heads are a multiple of 32 (faster attention), float16 elsewhere; else
    #: the model's own. "float16" and "int16" ask for one of them (a load error where it
    #: cannot apply; int16 without VNNI runs plain C, the same numbers but slower); "int8" a
    #: quarter of float32's bytes (a scale per token and KV head; a load error where it
    #: cannot apply); "float32" keeps a float32 export's KV as it is. A model exported with
    #: float16 KV (GPU exports) keeps it whatever this says.
    kv_dtype: str = "auto"
    #: Linux, CPU: cap the engine kernels' threads at the cores other programs leave free,
    #: looked at twice a second (engine.runtime.cpu_share: a step never waits on a thread
    #: the OS put aside; the same answers). False: the session's threads always.
    adaptive_threads: bool = True

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise InvalidOptionError("provider", f"expected one of {', '.join(PROVIDERS)}, "
                                     f"got {self.provider!r}", hint="use 'auto' to pick one")
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidOptionError("kv_dtype", f"expected one of {', '.join(KV_DTYPES)}, "
                                     f"got {self.kv_dtype!r}",
                                     hint="use 'auto' (16 bits where the engine's kernel "
                                          "runs attention), 'float16', 'int16', 'int8' or "
                                          "'float32'")
        if self.intra_op_threads is not None:
            _check_int("intra_op_threads", self.intra_op_threads, minimum=1,
                       hint="leave unset to use the physical cores")
        if self.spin_duration_us is not None:
            _check_int("spin_duration_us", self.spin_duration_us, minimum=0,
                       hint="0 turns spinning off; leave unset for ONNX Runtime's default")
        _check_int("kv_reserve_ahead", self.kv_reserve_ahead, minimum=1, hint="e.g. 256")
        _check_int("kv_grow_tokens", self.kv_grow_tokens, minimum=1, hint="e.g. 64")
        _check_int("prefill_chunk_size", self.prefill_chunk_size, minimum=1,
                   hint="e.g. 512")
        _check_int("kv_page_size", self.kv_page_size, minimum=1, hint="e.g. 32")
        _check_int("cache_reuse", self.cache_reuse, minimum=0,
                   hint="e.g. 256 (tokens), or 0 to turn reuse by shifting off")
        _check_int("max_batch", self.max_batch, minimum=1, hint="e.g. 4")
        _check_int("context_shift", self.context_shift, minimum=0,
                   hint="e.g. 4 (the first tokens kept), or 0 to end answers at the context")
        parse_limit(self.vram_limit, field="vram_limit")
        parse_limit(self.host_ram_limit, field="host_ram_limit")
        if self.disk_limit is not None:
            parse_limit(self.disk_limit, field="disk_limit")
        _check_int("kv_cache_bytes", self.kv_cache_bytes, minimum=0, hint="e.g. 512 MiB")
        if self.kv_max_len is not None:
            _check_int("kv_max_len", self.kv_max_len, minimum=16, hint="e.g. 4096")
        if self.speculative_head is not None and not isinstance(self.speculative_head, Mapping):
            raise InvalidOptionError("speculative_head", "expected a mapping like the "
                                     "metadata's speculative: block, got "
                                     f"{type(self.speculative_head).__name__}",
                                     hint="e.g. {'type': 'mtp', 'model': 'head.onnx', ...}")
