"""A byte-level BPE tokenizer trained in-process on Python standard-library source.

The special tokens, pre-tokenizer and chat template mirror the reference exports in
``shared/reference-models`` so the forge's tokenizer folder looks like a real one.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sysconfig
import tempfile
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|file_sep|>",
    "<|repo_name|>",
)
EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 0

CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2-style split: contractions, letters, single digits, punctuation runs, newlines.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_SMALL_CORPUS_BYTES = 400_000
_BYTES_PER_VOCAB_ENTRY = 250
_MODEL_MAX_LENGTH = 32768

_CACHE: dict[int, Path] = {}


def _corpus(max_bytes: int) -> list[str]:
    """Top-level stdlib ``.py`` files in name order, truncated at ``max_bytes`` in total."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    files = sorted(stdlib.glob("*.py"), key=lambda p: p.name)
    if max_bytes > _SMALL_CORPUS_BYTES:
        deeper = [p for p in stdlib.glob("*/**/*.py") if "site-packages" not in p.parts]
        files += sorted(deeper, key=lambda p: p.relative_to(stdlib).as_posix())
    for path in files:
        if path.name.startswith("_sysconfigdata"):
            continue  # machine-specific
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text[: max_bytes - total])
        total += len(texts[-1])
        if total >= max_bytes:
            break
    return texts


def _train(vocab_size: int) -> Tokenizer:
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (bytes + special tokens), "
            f"got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    cap = max(_SMALL_CORPUS_BYTES, vocab_size * _BYTES_PER_VOCAB_ENTRY)
    tok.train_from_iterator(_corpus(cap), trainer=trainer)
    return tok


def _tokenizer_config(chat_template: bool) -> dict[str, object]:
    decoder = {
        str(i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, content in enumerate(SPECIAL_TOKENS)
    }
    config: dict[str, object] = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": _MODEL_MAX_LENGTH,
        "pad_token": EOS_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    return config


def _trained_dir(vocab_size: int) -> Path:
    cached = _CACHE.get(vocab_size)
    if cached is not None and (cached / "tokenizer.json").is_file():
        return cached
    tmp = Path(tempfile.mkdtemp(prefix=f"forge-tok-{vocab_size}-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # one per process, not left behind
    _train(vocab_size).save(str(tmp / "tokenizer.json"))
    _CACHE[vocab_size] = tmp
    return tmp


def make_tokenizer_files(
    out_dir: Path, vocab_size: int = 512, *, chat_template: bool = True
) -> Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` (and ``chat_template.jinja``).

    Training happens once per ``vocab_size`` per process; later calls copy the files.
    Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_trained_dir(vocab_size) / "tokenizer.json", out_dir / "tokenizer.json")
    config = _tokenizer_config(chat_template)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    template_file = out_dir / "chat_template.jinja"
    if chat_template:
        template_file.write_text(CHAT_TEMPLATE)
    elif template_file.exists():
        template_file.unlink()
    return out_dir


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a forge (or any HF-style) folder."""
    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


#: A Hermes/Qwen-style chat template with tool support (written for the forge, in the
#: shape those models' templates have): the tools in the system turn, calls as
#: ``<tool_call>`` blocks, tool results as ``<tool_response>`` blocks in a user turn.
HERMES_CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call functions to answer. They are listed in <tools></tools>:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each call, write a JSON object with the function name and ' }}
{{- 'arguments in <tool_call></tool_call> tags:\n<tool_call>\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
{{- (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


def set_chat_template(model_dir: Path, template: str) -> Path:
    """Give a forged model folder another chat template (``chat_template.jinja`` and
    ``tokenizer_config.json`` both)."""
    model_dir = Path(model_dir)
    (model_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return model_dir
