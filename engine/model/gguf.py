"""Import a GGUF file as an onnxruntime-genai model folder, without PyTorch.

``import_gguf(FILE, OUT_DIR)`` reads the GGUF with the ``gguf`` package (memory-mapped) and
writes ``model.onnx`` + ``model.onnx.data`` (a GroupQueryAttention decoder like the
onnxruntime-genai builder's), ``genai_config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja`` and ``gguf_import.json`` (what became of
every weight: kept bit for bit, or re-quantized). Weights are read, converted and written one
tensor at a time. The folder appears whole or not at all: it is written into a hidden
sibling of ``OUT_DIR`` (:func:`~engine.model.folders.import_work_dir`) and renamed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import CancelledError, ModelLoadError, UnsupportedModelError
from engine.model.folders import import_work_dir
from engine.model.gguf_blocks import concat_rows
from engine.model.gguf_graph import DecoderShape, GraphBuilder, LayerWeights
from engine.model.gguf_header import check_complete
from engine.model.gguf_tokenizer import GGUFVocab, write_tokenizer
from engine.model.gguf_weights import PRECISIONS, WeightReader, unpermute_rows, vector
from engine.model.onnx_writer import OnnxWriter

#: GGUF general.architecture -> onnxruntime-genai's model type
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
#: architectures whose Q/K rows llama.cpp's converter permuted (for interleaved RoPE)
_PERMUTED = ("llama", "mistral")
METADATA_FILE = "gguf_import.json"
COMPUTES = ("fp32", "int8")


@dataclass(frozen=True)
class Progress:
    """One step of an import: ``done`` of ``total`` steps, and what was just written."""

    done: int
    total: int
    what: str


@dataclass(frozen=True)
class ImportResult:
    out_dir: Path
    seconds: float
    architecture: str
    precision: str
    lossless: int
    requantized: int
    bytes: int


class _Reader:
    """The GGUF's fields and tensors, with clear errors for what is missing."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.path = path
        if not path.is_file():
            raise ModelLoadError(f"{path} is not a file", hint="give the path of a .gguf file")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(
                f"{path} is not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF')",
                hint="pick a .gguf model file (Ollama keeps them as blobs named sha256-...)")
        check_complete(path)  # from the header alone: a cut download is refused at once
        try:
            self.r = GGUFReader(str(path), "r")
        except Exception as exc:  # the reader raises ValueError, IndexError, struct errors ...
            raise ModelLoadError(
                f"{path} is damaged or truncated: the gguf reader stopped with "
                f"{type(exc).__name__}: {exc}",
                hint="download the file again; a complete GGUF holds every tensor it lists"
            ) from exc
        self.tensors = {t.name: t for t in self.r.tensors}
        for t in self.r.tensors:
            expected = int(t.n_bytes)
            if np.asarray(t.data).nbytes != expected:
                raise ModelLoadError(
                    f"{path} is truncated: tensor {t.name} should hold {expected} bytes, the "
                    f"file has {np.asarray(t.data).nbytes}",
                    hint="download the file again")

    def field(self, key: str, default: Any = None) -> Any:
        f = self.r.fields.get(key)
        if f is None:
            return default
        value = f.contents()
        return default if value is None else value

    def need(self, key: str) -> Any:
        value = self.field(key)
        if value is None:
            raise ModelLoadError(f"{self.path} lacks the metadata field {key}",
                                 hint="the file is incomplete or from an old converter; "
                                      "download a current GGUF of the model")
        return value

    def tensor(self, name: str) -> Any:
        t = self.tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{self.path} lacks the tensor {name}",
                                 hint="the file is incomplete or not a decoder model of the "
                                      "architecture it claims")
        return t


def _shape(r: _Reader) -> DecoderShape:
    arch = str(r.need("general.architecture"))
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{r.path.name}: the GGUF architecture {arch!r} is not supported; import-gguf "
            f"converts {', '.join(ARCHITECTURES)}",
            hint="convert this model with onnxruntime-genai's builder from its Hugging Face "
                 "files, or pick a GGUF of a supported architecture")
    hidden = int(r.need(f"{arch}.embedding_length"))
    heads = int(r.need(f"{arch}.attention.head_count"))
    head_dim = int(r.field(f"{arch}.attention.key_length", hidden // heads))
    embd = r.tensor("token_embd.weight")
    vocab = int(embd.shape[1])
    scaling = str(r.field(f"{arch}.rope.scaling.type", "none"))
    scale = 1.0
    if scaling == "linear":
        scale = float(r.field(f"{arch}.rope.scaling.factor", 1.0))
    elif scaling not in ("none", ""):
        raise UnsupportedModelError(
            f"{r.path.name}: RoPE scaling {scaling!r} is not supported (only linear)",
            hint="pick a GGUF of the model without long-context RoPE scaling")
    window = r.field(f"{arch}.attention.sliding_window")
    return DecoderShape(
        arch=arch, layers=int(r.need(f"{arch}.block_count")), hidden=hidden, heads=heads,
        ffn=int(r.need(f"{arch}.feed_forward_length")),
        kv_heads=int(r.field(f"{arch}.attention.head_count_kv", heads)), head_dim=head_dim,
        vocab=vocab, context=int(r.need(f"{arch}.context_length")),
        rms_eps=float(r.field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(r.field(f"{arch}.rope.freq_base", 10000.0)),
        rope_dim=int(r.field(f"{arch}.rope.dimension_count", head_dim)), rope_scale=scale,
        sliding_window=int(window) if window else -1)


def _vocab(r: _Reader) -> GGUFVocab:
    def opt_int(key: str) -> int | None:
        value = r.field(key)
        return None if value is None else int(value)

    tokens = r.need("tokenizer.ggml.tokens")
    return GGUFVocab(
        model=str(r.need("tokenizer.ggml.model")), tokens=[str(t) for t in tokens],
        types=[int(t) for t in r.field("tokenizer.ggml.token_type", [1] * len(tokens))],
        merges=[str(m) for m in r.field("tokenizer.ggml.merges", [])],
        scores=[float(s) for s in r.field("tokenizer.ggml.scores", [])],
        pre=str(r.field("tokenizer.ggml.pre", "default")),
        bos_id=opt_int("tokenizer.ggml.bos_token_id"),
        eos_id=opt_int("tokenizer.ggml.eos_token_id"),
        eot_id=opt_int("tokenizer.ggml.eot_token_id"),
        unk_id=opt_int("tokenizer.ggml.unknown_token_id"),
        pad_id=opt_int("tokenizer.ggml.padding_token_id"),
        add_bos=r.field("tokenizer.ggml.add_bos_token"),
        add_space_prefix=r.field("tokenizer.ggml.add_space_prefix"),
        chat_template=r.field("tokenizer.chat_template"))


def _expected_shapes(s: DecoderShape) -> dict[str, tuple[int, ...]]:
    """Each layer tensor's GGUF shape (``[K, N]`` for a projection) per the metadata."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    ffn = s.ffn
    return {"attn_norm": (s.hidden,), "ffn_norm": (s.hidden,), "attn_q": (s.hidden, q),
            "attn_k": (s.hidden, kv), "attn_v": (s.hidden, kv), "attn_output": (q, s.hidden),
            "ffn_gate": (s.hidden, ffn), "ffn_up": (s.hidden, ffn), "ffn_down": (ffn, s.hidden)}


def _layer(r: _Reader, w: WeightReader, s: DecoderShape, i: int) -> LayerWeights:
    shapes = _expected_shapes(s)

    def t(name: str) -> Any:
        found = r.tensor(f"blk.{i}.{name}.weight")
        shape = tuple(int(d) for d in found.shape)
        if shape != shapes[name]:
            raise ModelLoadError(
                f"{r.path.name}: blk.{i}.{name}.weight has shape {list(shape)}, the metadata "
                f"({s.arch}: hidden {s.hidden}, {s.heads} heads of {s.head_dim}, "
                f"{s.kv_heads} KV heads, feed-forward {s.ffn}) says {list(shapes[name])}",
                hint="the file's metadata and tensors disagree: download the file again")
        return found

    def opt(name: str) -> np.ndarray | None:
        found = r.tensors.get(f"blk.{i}.{name}")
        return vector(found) if found is not None else None

    permuted = s.arch in _PERMUTED
    lw = LayerWeights(
        attn_norm=vector(t("attn_norm")),
        q=w.linear(t("attn_q"), s.heads if permuted else None),
        k=w.linear(t("attn_k"), s.kv_heads if permuted else None),
        v=w.linear(t("attn_v")), o=w.linear(t("attn_output")),
        ffn_norm=vector(t("ffn_norm")), gate=w.linear(t("ffn_gate")),
        up=w.linear(t("ffn_up")), down=w.linear(t("ffn_down")),
        q_bias=opt("attn_q.bias"), k_bias=opt("attn_k.bias"), v_bias=opt("attn_v.bias"),
        q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"))
    if permuted and lw.q_bias is not None and lw.k_bias is not None:
        lw.q_bias = unpermute_rows(lw.q_bias, s.heads)
        lw.k_bias = unpermute_rows(lw.k_bias, s.kv_heads)
    if lw.q_norm is None and not any(isinstance(p, np.ndarray) for p in (lw.q, lw.k, lw.v)):
        lw.qkv = concat_rows([lw.q, lw.k, lw.v])  # type: ignore[list-item]
    return lw


def _genai_config(s: DecoderShape, vocab: GGUFVocab) -> dict[str, Any]:
    eos = [t for t in (vocab.eos_id, vocab.eot_id) if t is not None]
    eos = list(dict.fromkeys(eos))
    pad = vocab.pad_id if vocab.pad_id is not None else (eos[0] if eos else 0)
    return {
        "model": {
            "bos_token_id": vocab.bos_id if vocab.bos_id is not None else pad,
            "context_length": s.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx", "head_size": s.head_dim, "hidden_size": s.hidden,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": s.heads, "num_hidden_layers": s.layers,
                "num_key_value_heads": s.kv_heads,
            },
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": pad, "type": ARCHITECTURES[s.arch], "vocab_size": s.vocab,
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True,
            "length_penalty": 1.0, "max_length": s.context, "min_length": 0,
            "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
            "past_present_share_buffer": True, "repetition_penalty": 1.0, "temperature": 1.0,
            "top_k": 50, "top_p": 1.0,
        },
    }


def import_gguf(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                precision: str = "auto", compute: str = "int8",
                progress: Callable[[Progress], None] | None = None,
                cancel: Callable[[], bool] | None = None) -> ImportResult:
    """Convert ``path`` into the model folder ``out_dir`` (which must not exist yet, or be
    empty). ``progress`` hears of every step; ``cancel`` returning True stops the import
    (CancelledError) and leaves nothing behind. ``compute``: "int8" (activations quantized
    to 8 bits, as the onnxruntime-genai builder's CPU exports and llama.cpp do; the faster)
    or "fp32" (4-bit projections multiply in fp32: the GGUF's own arithmetic, top-1 closest
    to llama.cpp's results, ~0.75x the decode speed; bench/gguf_import.md)."""
    if compute not in COMPUTES:
        raise ModelLoadError(f"compute must be one of {', '.join(COMPUTES)}, got {compute!r}",
                             hint="use --compute int8 (or fp32)")
    if precision not in PRECISIONS:
        raise ModelLoadError(f"precision must be one of {', '.join(PRECISIONS)}, "
                             f"got {precision!r}", hint="use --precision auto")
    start = time.monotonic()
    src, dst = Path(path), Path(out_dir)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ModelLoadError(f"{dst} already exists and is not empty",
                             hint="choose a new folder, or delete that one first")
    r = _Reader(src)
    s = _shape(r)
    vocab = _vocab(r)
    tied = "output.weight" not in r.tensors
    work = import_work_dir(dst)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    total = s.layers + 3
    done = 0

    def step(what: str) -> None:
        nonlocal done
        if cancel is not None and cancel():
            raise CancelledError(f"import of {src.name} cancelled")
        done += 1
        if progress is not None:
            progress(Progress(min(done, total), total, what))

    writer = OnnxWriter(work / "model.onnx")
    weights = WeightReader(precision)
    try:
        step("tokenizer")
        write_tokenizer(vocab, work, s.context)
        freqs = r.tensors.get("rope_freqs.weight")
        graph = GraphBuilder(writer, s, compute=compute)
        graph.build(
            embed=lambda: weights.linear(r.tensor("token_embd.weight")), tied=tied,
            layer=lambda i: _layer(r, weights, s, i),
            final_norm=lambda: vector(r.tensor("output_norm.weight")),
            head=None if tied else (lambda: weights.linear(r.tensor("output.weight"))),
            freq_factors=vector(freqs) if freqs is not None else None, progress=step)
        writer.save(*graph.io())
        (work / "genai_config.json").write_text(json.dumps(_genai_config(s, vocab), indent=4)
                                                + "\n")
        summary = weights.log.summary()
        meta = {
            "source": {"file": src.name, "bytes": src.stat().st_size,
                       "name": r.field("general.name"), "license": r.field("general.license"),
                       "architecture": s.arch, "file_type": r.field("general.file_type")},
            "precision": precision, "compute": compute, "tied_embeddings": tied,
            "notes": vocab.notes,
            "summary": {k: v for k, v in summary.items() if k != "requantized_tensors"},
            "tensors": weights.log.tensors,
        }
        (work / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if dst.exists():
            dst.rmdir()
        work.rename(dst)
    except BaseException as exc:
        writer.abandon()
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, (ValueError, IndexError, KeyError, TypeError, NotImplementedError)):
            raise ModelLoadError(
                f"{src.name} could not be converted: {type(exc).__name__}: {exc}",
                hint="the file may be damaged (download it again) or use a tensor layout "
                     "import-gguf does not know") from exc
        raise
    size = sum(p.stat().st_size for p in dst.iterdir() if p.is_file())
    return ImportResult(dst, time.monotonic() - start, s.arch, precision, summary["lossless"],
                        summary["requantized_or_rounded"], size)
