"""Each dialect's sampling fields -> ``GenerateOptions``, with that dialect's defaults.

- OpenAI: temperature 1, top_p 1; ``top_p: 0`` keeps only the most likely token.
- llama.cpp: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 (its server's defaults).
  ``samplers`` names the steps that run (``top_k``, ``top_p``, ``min_p``,
  ``temperature``, ``penalties``; or llama.cpp's letters ``kpmte``); the engine applies
  them in its own fixed order (penalties, temperature, top-k, top-p, min-p). ``dry``,
  ``typ_p``, ``xtc`` and ``infill`` are accepted and not applied (their llama.cpp
  defaults leave the distribution unchanged, except ``infill``'s end-of-text boost).
  ``seed`` -1 (or 0xFFFFFFFF) means random.
- Ollama: temperature 0.8, top_k 40, top_p 0.9; ``repeat_penalty`` only when sent (the
  engine's penalty spans the whole sequence, not Ollama's last 64 tokens).

Every dialect refuses values outside the sampling ranges (``engine.server.schemas``:
temperature 0-100, top_p and min_p 0-1, top_k -1 or more, a repetition penalty 0.01-100,
``n_predict`` -1 or more, Ollama's ``num_predict`` -2 or more but 0, ``max_tokens`` 1 or
more) with a 400 naming the field and the range, rather than clamping them silently.

Those defaults come last: a field a request leaves out takes the model's recommendation
first (the user's preset, ``generation_config.json``, ``genai_config.json``'s search
section: ``engine.model.sampling_defaults``). Code completion (``/infill``, a ``suffix``)
is greedy unless the preset's ``infill`` entry says otherwise.

Stop strings that are the text of a special token (``<|endoftext|>``) become token stops:
special tokens never appear in the output text, so a text stop could never match them.

Structured output (the engine's llguidance constraint, ``engine.generation.guidance``): OpenAI
``response_format`` ``json_object`` (an object), ``json_schema`` (``json_schema.schema``),
and this worker's ``regex`` / ``grammar`` types; Ollama ``format`` ``"json"`` (an object)
or a schema; llama.cpp ``json_schema`` (``{}`` = any JSON value), ``grammar`` (GBNF) and
``regex``. A schema or grammar llguidance refuses is a 400 quoting its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.config import ConstraintSpec, GenerateOptions, StopSequence
from engine.constraint import ConstraintKind
from engine.errors import InvalidOptionError
from engine.model.sampling_defaults import Dialect
from engine.server.errors import ApiError, from_exception
from engine.server.models import LoadedModel
from engine.server.schemas import LlamaSampling, OllamaOptions, ResponseFormat, _OpenAISampling
from engine.text.tokenizer import Tokenizer

OPENAI_RENAMES = {"max_new_tokens": "max_tokens", "stop_sequences": "stop"}
LLAMA_RENAMES = {"max_new_tokens": "n_predict", "repetition_penalty": "repeat_penalty",
                 "top_logprobs": "n_probs", "stop_sequences": "stop"}
OLLAMA_RENAMES = {"max_new_tokens": "options.num_predict", "max_context": "options.num_ctx",
                  "repetition_penalty": "options.repeat_penalty", "stop_sequences": "options.stop",
                  "temperature": "options.temperature", "top_k": "options.top_k",
                  "top_p": "options.top_p", "min_p": "options.min_p", "seed": "options.seed",
                  "presence_penalty": "options.presence_penalty",
                  "frequency_penalty": "options.frequency_penalty"}

_LLAMA_LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "m": "min_p",
                  "x": "xtc", "t": "temperature", "i": "infill", "e": "penalties"}
_LLAMA_ALIASES = {"typical_p": "typ_p", "nucleus": "top_p", "temp": "temperature",
                  "penalty": "penalties"}
_SEED_SPACE = 2**64


def make_options(fields: Mapping[str, Any], renames: Mapping[str, str]) -> GenerateOptions:
    try:
        return GenerateOptions(**fields)
    except InvalidOptionError as exc:
        raise from_exception(exc, renames=renames) from exc


def _constraint(param: str, kind: ConstraintKind, schema: Mapping[str, Any] | None = None,
                object_only: bool = False, text: str | None = None) -> ConstraintSpec:
    try:
        return ConstraintSpec(kind, schema, object_only, text)
    except InvalidOptionError as exc:
        raise from_exception(exc, renames={"constraint": param}) from exc


def response_constraint(fmt: ResponseFormat | None) -> ConstraintSpec | None:
    """OpenAI ``response_format`` -> the constraint (None for text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type in ("regex", "grammar"):
        kind: ConstraintKind = "regex" if fmt.type == "regex" else "grammar"
        text = fmt.regex if kind == "regex" else fmt.grammar
        if not text:
            raise ApiError(400, f"response_format: type {kind} needs {kind}",
                           param="response_format",
                           hint=f'send {{"type": "{kind}", "{kind}": "..."}}')
        return _constraint("response_format", kind, text=text)
    if fmt.type == "json_object":
        return _constraint("response_format", "json_object", object_only=True)
    if fmt.type == "json_schema":
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        if schema is None:
            raise ApiError(400, "response_format: json_schema needs json_schema.schema",
                           param="response_format",
                           hint='send {"type": "json_schema", "json_schema": {"name": "x", '
                           '"schema": {...}}}')
        return _constraint("response_format", "json_schema", schema)
    raise ApiError(400, f"response_format: type must be text, json_object, json_schema, "
                   f"regex or grammar, got {fmt.type!r}", param="response_format")


def llama_constraint(body: LlamaSampling) -> ConstraintSpec | None:
    """llama.cpp ``json_schema``, ``grammar`` (GBNF) and this worker's ``regex``."""
    given = [name for name in ("json_schema", "grammar", "regex") if getattr(body, name)
             or (name == "json_schema" and body.json_schema is not None)]
    if len(given) > 1:
        raise ApiError(400, f"{given[1]}: send one of json_schema, grammar and regex, got "
                       f"{' and '.join(given)}", param=given[1])
    if body.json_schema is not None:
        return _constraint("json_schema", "json_schema", body.json_schema)
    if body.grammar:
        return _constraint("grammar", "grammar", text=body.grammar)
    if body.regex:
        return _constraint("regex", "regex", text=body.regex)
    return None


def ollama_constraint(fmt: str | Mapping[str, Any] | None) -> ConstraintSpec | None:
    """Ollama ``format``: ``"json"`` (an object) or a JSON schema."""
    if not fmt:
        return None
    if isinstance(fmt, str):
        if fmt.strip().lower() != "json":
            raise ApiError(400, f'format: expected "json" or a JSON schema, got {fmt!r}',
                           param="format")
        return _constraint("format", "json_object", object_only=True)
    return _constraint("format", "json_schema", fmt)


def seed_value(seed: int | None, *, random: Sequence[int] = ()) -> int | None:
    """Any integer is a seed (folded into 64 bits); ``random`` values mean no seed."""
    if seed is None or seed in random:
        return None
    return seed % _SEED_SPACE


def stop_sequences(stops: str | Sequence[str] | None, tokenizer: Tokenizer
                   ) -> tuple[StopSequence, ...]:
    if stops is None:
        return ()
    items = [stops] if isinstance(stops, str) else list(stops)
    out: list[StopSequence] = []
    for text in items:
        if not text:
            continue  # clients send "" to mean nothing; the engine refuses empty stops
        token = tokenizer.token_to_id(text)
        if token is not None and token in tokenizer.special_token_ids:
            out.append((token,))
        else:
            out.append(text)
    return tuple(dict.fromkeys(out))


def logit_bias(raw: Mapping[str, float] | Sequence[Sequence[Any]] | None, vocab_size: int,
               tokenizer: Tokenizer, *, allow_text: bool = False) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}``, or llama.cpp's ``[[id or text, bias or false]]``
    (``allow_text``: a text key biases each of its tokens)."""
    param = "logit_bias"
    if not raw:
        return {}
    pairs: list[tuple[Any, Any]] = []
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    else:
        for entry in raw:
            if len(entry) != 2:
                raise ApiError(400, f"{param}: expected [token, bias] pairs, got {entry!r}",
                               param=param)
            pairs.append((entry[0], entry[1]))
    bias: dict[int, float] = {}
    for key, value in pairs:
        amount = -100.0 if value is False else value
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ApiError(400, f"{param}: bias for {key!r} must be a number", param=param)
        for token in _bias_tokens(key, tokenizer, allow_text):
            if not 0 <= token < vocab_size:
                raise ApiError(400, f"{param}: token id {token} is outside the vocabulary "
                               f"(0..{vocab_size - 1})", param=param)
            bias[token] = float(amount)
    return bias


def _bias_tokens(key: Any, tokenizer: Tokenizer, allow_text: bool) -> list[int]:
    if isinstance(key, int) and not isinstance(key, bool):
        return [key]
    if isinstance(key, str):
        try:
            return [int(key.strip())]
        except ValueError:
            pass
        if key and allow_text:
            return tokenizer.encode(key, parse_special=False)
    raise ApiError(400, f"logit_bias: keys are token ids, got {key!r}", param="logit_bias",
                   hint='e.g. {"42": -100}')


def _given(value: Any, model: LoadedModel, dialect: Dialect, name: str, code: bool) -> Any:
    """``value`` when the request sent it, else the model's recommendation for ``name`` on
    ``dialect`` (``engine.model.sampling_defaults``: the user's preset, the model's own
    configs, the dialect's default)."""
    return model.sampling.value(dialect, name, code) if value is None else value


def openai_options(body: _OpenAISampling, model: LoadedModel, *, max_tokens: int | None,
                   top_logprobs: int | None, logprobs_field: str = "top_logprobs",
                   code: bool = False) -> GenerateOptions:
    """``code``: a code completion (a ``suffix``), whose left-out fields are greedy unless
    the user's preset says otherwise."""
    engine = model.engine
    def pick(value: Any, name: str) -> Any:
        return _given(value, model, "openai", name, code)

    temperature = pick(body.temperature, "temperature")
    top_p = pick(body.top_p, "top_p")
    if top_p == 0:
        temperature, top_p = 0.0, 1.0
    max_tokens = pick(max_tokens, "max_tokens")
    return make_options({
        "max_new_tokens": engine.context_length if max_tokens is None else max_tokens,
        "temperature": temperature, "top_p": top_p,
        "top_k": max(pick(body.top_k, "top_k"), 0),
        "min_p": pick(body.min_p, "min_p"),
        "repetition_penalty": pick(body.repetition_penalty, "repetition_penalty"),
        "frequency_penalty": pick(body.frequency_penalty, "frequency_penalty") or 0.0,
        "presence_penalty": pick(body.presence_penalty, "presence_penalty") or 0.0,
        "logit_bias": logit_bias(body.logit_bias, engine.spec.vocab_size, engine.tokenizer),
        "seed": seed_value(pick(body.seed, "seed")),
        "stop_sequences": stop_sequences(body.stop, engine.tokenizer),
        "top_logprobs": top_logprobs,
        "constraint": response_constraint(body.response_format),
    }, {**OPENAI_RENAMES, "top_logprobs": logprobs_field})


def _llama_samplers(value: Sequence[str] | str | None) -> set[str] | None:
    if value is None:
        return None
    names = [_LLAMA_LETTERS.get(c, c) for c in value] if isinstance(value, str) else value
    cleaned = {str(n).strip().lower().replace("-", "_") for n in names}
    return {_LLAMA_ALIASES.get(n, n) for n in cleaned}


def llama_options(body: LlamaSampling, model: LoadedModel, *, seed_offset: int = 0,
                  code: bool = False) -> GenerateOptions:
    """``code``: ``/infill``, whose left-out fields are greedy unless the user's preset
    says otherwise."""
    engine = model.engine
    active = _llama_samplers(body.samplers)
    def on(name: str) -> bool:
        return active is None or name in active

    def pick(value: Any, name: str) -> Any:
        return _given(value, model, "llamacpp", name, code)

    temp = pick(body.temperature, "temperature")
    temperature = max(temp, 0.0) if on("temperature") else 1.0
    top_k = max(pick(body.top_k, "top_k"), 0)
    top_k = top_k if on("top_k") else 0
    top_p = pick(body.top_p, "top_p")
    if not on("top_p") or top_p >= 1.0:
        top_p = 1.0
    elif top_p <= 0.0:
        top_p, top_k = 1.0, 1  # llama.cpp keeps one token
    min_p = pick(body.min_p, "min_p")
    min_p = min(min_p, 1.0) if on("min_p") and min_p > 0 else 0.0
    penalties = on("penalties")
    repeat = pick(body.repeat_penalty, "repetition_penalty")
    repeat = repeat if repeat and repeat > 0 else 1.0
    seed = seed_value(pick(body.seed, "seed"), random=(-1, 0xFFFFFFFF))
    n_predict = body.n_predict if "n_predict" in body.model_fields_set else \
        pick(None, "max_tokens")
    n_predict = -1 if n_predict is None else n_predict
    return make_options({
        "max_new_tokens": engine.context_length if n_predict < 0 else n_predict,
        "temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
        "repetition_penalty": repeat if penalties else 1.0,
        "presence_penalty": (pick(body.presence_penalty, "presence_penalty") or 0.0)
        if penalties else 0.0,
        "frequency_penalty": (pick(body.frequency_penalty, "frequency_penalty") or 0.0)
        if penalties else 0.0,
        "logit_bias": logit_bias(body.logit_bias, engine.spec.vocab_size, engine.tokenizer,
                                 allow_text=True),
        "seed": None if seed is None else (seed + seed_offset) % _SEED_SPACE,
        "stop_sequences": stop_sequences(body.stop, engine.tokenizer),
        "stop_on_eos": not body.ignore_eos,
        "top_logprobs": body.n_probs if body.n_probs > 0 else None,
        "constraint": llama_constraint(body),
    }, LLAMA_RENAMES)


def ollama_options(options: OllamaOptions | None, model: LoadedModel,
                   fmt: str | Mapping[str, Any] | None = None, *, code: bool = False
                   ) -> GenerateOptions:
    """``code``: a ``suffix`` (code completion), whose left-out fields are greedy unless
    the user's preset says otherwise."""
    engine = model.engine
    o = options or OllamaOptions()
    def pick(value: Any, name: str) -> Any:
        return _given(value, model, "ollama", name, code)

    temperature = max(pick(o.temperature, "temperature"), 0.0)
    top_k = max(pick(o.top_k, "top_k"), 0)
    top_p = pick(o.top_p, "top_p")
    if top_p >= 1.0:
        top_p = 1.0
    elif top_p <= 0.0:
        top_p, temperature = 1.0, 0.0
    num_predict = pick(o.num_predict, "max_tokens")
    return make_options({
        "max_new_tokens": engine.context_length if num_predict is None or num_predict < 0
        else num_predict,
        "max_context": None if o.num_ctx is None else min(o.num_ctx, engine.context_length)
        if o.num_ctx >= 2 else o.num_ctx,
        "temperature": temperature, "top_k": top_k, "top_p": top_p,
        "min_p": pick(o.min_p, "min_p"),
        "repetition_penalty": pick(o.repeat_penalty, "repetition_penalty"),
        "presence_penalty": pick(o.presence_penalty, "presence_penalty") or 0.0,
        "frequency_penalty": pick(o.frequency_penalty, "frequency_penalty") or 0.0,
        "seed": seed_value(pick(o.seed, "seed"), random=(-1,)),
        "stop_sequences": stop_sequences(o.stop, engine.tokenizer),
        "constraint": ollama_constraint(fmt),
    }, OLLAMA_RENAMES)
