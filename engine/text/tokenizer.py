"""The model's tokenizer: encode/decode, chat templates, and a streaming detokenizer.

Wraps a Hugging Face ``tokenizers`` ``tokenizer.json`` and the HF-side files around it
(``tokenizer_config.json``, ``chat_template.jinja``). Encoding never adds special tokens
through the tokenizer's post-processor: callers ask for BOS explicitly (``add_bos``), and
``adds_bos_by_default`` tells them what the model's own tokenizer would do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from engine.text.chat_template import ChatMessage, ChatTemplate, message_dict

__all__ = ["ChatMessage", "StreamingDetokenizer", "Tokenizer"]
from engine.errors import InvalidPromptError, TokenizerError

_REPLACEMENT = "\ufffd"
# Held tokens after which a streaming detokenizer restarts its window. A UTF-8 character
# spans at most 4 bytes, so a longer run ending in U+FFFD holds invalid bytes.
_MAX_HOLD = 8


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(
            f"cannot read {path}: {exc}",
            hint=f"{path.name} is damaged; re-download it from the model's source repository",
        ) from exc


def _token_content(value: object) -> str | None:
    """``"<s>"`` or ``{"content": "<s>", ...}`` (a serialized AddedToken) -> the text."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


def _load_backend(path: Path) -> _HFTokenizer:
    if not path.is_file():
        raise TokenizerError(
            f"{path} not found",
            hint="copy tokenizer.json from the model's source repository into "
            f"{path.parent} (exporters write it next to model.onnx)",
        )
    try:
        head = path.read_bytes()[:64]
    except OSError as exc:
        raise TokenizerError(f"cannot read {path}: {exc}",
                             hint="check the file's permissions") from exc
    if head.startswith(b"version https://git-lfs"):
        raise TokenizerError(
            f"{path} is a Git LFS pointer, not the tokenizer",
            hint="run `git lfs pull` in the model repository, or download the file directly",
        )
    try:
        return _HFTokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises plain Exception
        raise TokenizerError(
            f"cannot parse {path}: {exc}",
            hint="the file is damaged or not a Hugging Face tokenizers file; re-download it",
        ) from exc


def _template_from_config(config: Mapping[str, Any], source: Path) -> str | None:
    """HF accepts a string or named templates (a list of {name, template}, or a dict)."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    named: dict[str, str] = {}
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, Mapping) and isinstance(entry.get("template"), str):
                named[str(entry.get("name", ""))] = entry["template"]
    elif isinstance(value, Mapping):
        named = {str(k): v for k, v in value.items() if isinstance(v, str)}
    if not named:
        raise TokenizerError(
            f"{source}: chat_template has an unexpected shape ({type(value).__name__})",
            hint="chat_template must be a string or a list of {name, template} objects",
        )
    return named.get("default", next(iter(named.values())))


def _find_template(model_dir: Path, config: Mapping[str, Any]) -> tuple[str, Path] | None:
    """``chat_template.jinja`` (where the onnxruntime-genai builder moves it) wins over
    ``tokenizer_config.json``, as in transformers."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), path
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"cannot read {path}: {exc}",
                                 hint="re-download the chat template file") from exc
    config_path = model_dir / "tokenizer_config.json"
    text = _template_from_config(config, config_path)
    return (text, config_path) if text else None


class Tokenizer:
    """A loaded tokenizer. Build it with :meth:`from_dir` (or the constructor for tests)."""

    def __init__(
        self,
        backend: _HFTokenizer,
        config: Mapping[str, Any] | None = None,
        *,
        chat_template: str | None = None,
        template_source: str = "chat template",
    ) -> None:
        config = config or {}
        #: The fill-in-the-middle order the model was trained on best (``fim_order`` in
        #: tokenizer_config.json: "psm" or "spm"; None: not said, prefix-suffix-middle).
        order = config.get("fim_order")
        self.fim_order: str | None = order if order in ("psm", "spm") else None
        self._tk = backend
        self._lock = threading.Lock()
        self._texts: list[str] | None = None
        added = backend.get_added_tokens_decoder()
        self.vocab_size: int = max(backend.get_vocab_size(with_added_tokens=True),
                                   max(added, default=-1) + 1)
        self.eos_token: str | None = _token_content(config.get("eos_token"))
        self.bos_token: str | None = _token_content(config.get("bos_token"))
        eos_id = backend.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_ids: tuple[int, ...] = () if eos_id is None else (eos_id,)
        self.bos_token_id: int | None = (
            backend.token_to_id(self.bos_token) if self.bos_token else None
        )
        special = {i for i, tok in added.items() if tok.special}
        self._skipped = frozenset(special)  # what decode(skip_special_tokens=True) drops
        special.update(self.eos_token_ids)
        if self.bos_token_id is not None:
            special.add(self.bos_token_id)
        self.special_token_ids: frozenset[int] = frozenset(special)
        probe = backend.encode("", add_special_tokens=True).ids  # what the post-processor adds
        if self.bos_token_id is None and probe and probe[0] in special:
            self.bos_token_id = probe[0]  # no tokenizer_config.json, but a BOS-adding tokenizer
        self.adds_bos_by_default: bool = bool(probe) and probe[0] == self.bos_token_id
        names = {k: _token_content(config.get(k)) for k in
                 ("bos_token", "eos_token", "unk_token", "pad_token")}
        self._template = ChatTemplate(
            chat_template, template_source, {k: v for k, v in names.items() if v is not None},
        ) if chat_template else None

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        """Load ``tokenizer.json`` (required), ``tokenizer_config.json`` and a chat template."""
        model_dir = Path(model_dir)
        backend = _load_backend(model_dir / "tokenizer.json")
        config: Mapping[str, Any] = {}
        config_path = model_dir / "tokenizer_config.json"
        if config_path.is_file():
            data = _read_json(config_path)
            if not isinstance(data, Mapping):
                raise TokenizerError(
                    f"{config_path} holds a {type(data).__name__}, expected a JSON object",
                    hint="re-download tokenizer_config.json, or delete it to load without it",
                )
            config = data
        found = _find_template(model_dir, config)
        return cls(backend, config, chat_template=found[0] if found else None,
                   template_source=str(found[1]) if found else "chat template")

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    @property
    def skipped_ids(self) -> frozenset[int]:
        """The ids whose text ``detokenizer(skip_special=True)`` drops."""
        return self._skipped

    def id_to_token(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``.

        ``parse_special=True``: special-token text such as ``<|im_start|>`` becomes its id
        (raw prompts from editors rely on this). ``False``: it is tokenized as plain text,
        for untrusted text placed inside a template. ``add_bos`` prepends BOS once.
        """
        with self._lock:  # the flag lives on the shared Rust object
            self._tk.encode_special_tokens = not parse_special
            ids: list[int] = self._tk.encode(text, add_special_tokens=False).ids
        bos = self.bos_token_id
        if add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special)

    def detokenizer(self, *, skip_special: bool = False) -> StreamingDetokenizer:
        return StreamingDetokenizer(self._tk, skip_ids=self._skipped if skip_special else None)

    def backend_json(self) -> str:
        """The ``tokenizer.json`` text of the backend (llguidance builds its view from it)."""
        return self._tk.to_str()

    def token_texts(self) -> list[str]:
        """The text each id adds when it follows other text (computed once, cached).

        Decoded after a context token, so SentencePiece's leading-space stripping does not
        apply; partial UTF-8 byte tokens read as U+FFFD; special tokens keep their text.
        """
        if self._texts is None:
            self._texts = self._compute_token_texts()
        return self._texts

    def _compute_token_texts(self) -> list[str]:
        ids = range(self.vocab_size)
        single = self._tk.decode_batch([[i] for i in ids], skip_special_tokens=False)
        plain = self._tk.token_to_id("a")  # a context piece without a leading-space marker
        ctx = [plain] if plain is not None else self.encode("a", parse_special=False)
        if len(ctx) != 1:
            return single
        ctx_text = self._tk.decode(ctx, skip_special_tokens=False)
        paired = self._tk.decode_batch([[ctx[0], i] for i in ids], skip_special_tokens=False)
        n = len(ctx_text)
        return [p[n:] if p.startswith(ctx_text) else s for p, s in zip(paired, single, strict=True)]

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    @property
    def chat_template_source(self) -> str | None:
        return self._template.source if self._template is not None else None

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage | Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Render ``messages`` with the model's chat template (Hugging Face semantics).

        ``extra`` adds template variables (e.g. ``enable_thinking``). Raises
        :class:`TokenizerError` when there is no template or the template fails.
        """
        if self._template is None:
            raise TokenizerError(
                "this model has no chat template",
                hint="send a raw prompt (completions) instead of chat messages, or add a "
                "chat_template.jinja to the model folder",
            )
        if not messages:
            raise InvalidPromptError("the conversation has no messages",
                                     hint="send at least one message")
        return self._template.render(
            [message_dict(m, i) for i, m in enumerate(messages)],
            add_generation_prompt=add_generation_prompt, tools=tools, extra=extra,
        )


    def encode_chat(
        self,
        messages: Sequence[ChatMessage | Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Render and encode a conversation; message text never becomes control tokens.

        A user who types ``<|im_end|>`` must not end their own turn. When no message holds
        special-token text the rendered prompt is encoded whole (exactly as Hugging Face
        does); otherwise each message's text is encoded with special parsing off.
        """
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tools=tools, extra=extra)
        specials = [t for t in self._special_strings() if t]
        contents = [str(message_dict(m, i).get("content") or "")
                    for i, m in enumerate(messages)]
        if not any(tok in c for c in contents for tok in specials):
            return self.encode(text, parse_special=True)
        ids: list[int] = []
        cursor = 0
        for content in contents:
            at = text.find(content, cursor) if content else -1
            if at < 0:
                continue  # the template rewrote this message: nothing literal to protect
            ids += self.encode(text[cursor:at], parse_special=True)
            ids += self.encode(content, parse_special=False)
            cursor = at + len(content)
        return ids + self.encode(text[cursor:], parse_special=True)

    def _special_strings(self) -> list[str]:
        return [t for t in (self.id_to_token(i) for i in self.special_token_ids) if t]

class StreamingDetokenizer:
    """Turns generated ids into text pieces as soon as the text is stable.

    Decodes a small window: the last piece's tokens (context, so decoders that strip a
    leading space act as in a full decode) plus the pending ones. Trailing U+FFFD (a
    character split across byte tokens) is held back, the text before it emitted. All
    ``add()`` results plus ``flush()`` equal ``decode(all_ids)`` for byte-level tokenizers
    (ByteFallback decoders void a whole byte run when any of it is invalid, so there only
    for valid UTF-8). Runs of invalid bytes restart the window after ``_MAX_HOLD`` tokens.
    """

    __slots__ = ("_base", "_decode", "_extra", "_ids", "_parts", "_prefix", "_read", "_skip",
                 "_skip_ids")

    def __init__(self, backend: _HFTokenizer, *, skip_ids: frozenset[int] | None = None) -> None:
        self._decode = backend.decode
        self._skip = skip_ids is not None
        # skipped specials never reach the decoder, so they never enter the window either
        self._skip_ids = skip_ids or frozenset()
        self._ids: list[int] = []
        self._prefix = 0  # window start: the previous piece's tokens (context)
        self._read = 0  # tokens before this index have been emitted
        self._base = 0  # len(decode(ids[prefix:read])), or -1 when not computed yet
        self._extra = 0  # chars past ``_base`` already emitted while holding
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def add(self, token_id: int) -> str:
        """Append one id; return the newly stable text (possibly "")."""
        if token_id in self._skip_ids:
            return ""
        ids = self._ids
        ids.append(token_id)
        text = self._decode(ids[self._prefix:], skip_special_tokens=self._skip)
        base = self._context_len()
        start = base + self._extra
        if not text.endswith(_REPLACEMENT):
            piece = text[start:]
            if piece:  # the new tokens become the next window's context
                self._prefix, self._base = self._read, -1
            else:  # they decode to nothing (skipped specials): keep the old context
                self._base = len(text)
            self._read, self._extra = len(ids), 0
        elif len(ids) - self._read <= _MAX_HOLD:
            stable = len(text.rstrip(_REPLACEMENT))
            if stable <= start:
                return ""
            self._extra = stable - base
            piece = text[start:stable]
        else:
            piece = self._reanchor(text, start)
        if piece:
            self._parts.append(piece)
        return piece

    def _context_len(self) -> int:
        if self._base < 0:
            context = self._ids[self._prefix:self._read]
            self._base = len(self._decode(context, skip_special_tokens=self._skip))
        return self._base

    def _reanchor(self, text: str, start: int) -> str:
        """Too many tokens held (only runs of invalid bytes get here): restart the window at
        the fewest last tokens whose text, decoded alone, is the end of ``text``; emit the
        text before them."""
        ids, decode, skip = self._ids, self._decode, self._skip
        for tail in range(1, min(len(ids) - self._prefix, _MAX_HOLD) + 1):
            head = decode(ids[self._prefix:len(ids) - tail], skip_special_tokens=skip)
            cut = len(head)
            if cut < len(text) and text.startswith(head) and (
                    decode(ids[-tail:], skip_special_tokens=skip) == text[cut:]):
                self._prefix = self._read = len(ids) - tail
                self._base, self._extra = 0, max(0, start - cut)
                return text[start:cut]
        self._prefix, self._read = self._read, len(ids)
        self._base, self._extra = -1, 0
        return text[start:]

    def flush(self) -> str:
        """Return whatever is still held (call once, at the end of generation)."""
        ids = self._ids
        if self._read == len(ids):
            return ""
        text = self._decode(ids[self._prefix:], skip_special_tokens=self._skip)
        piece = text[self._context_len() + self._extra:]
        self._prefix, self._read = self._read, len(ids)
        self._base, self._extra = -1, 0
        if piece:
            self._parts.append(piece)
        return piece
