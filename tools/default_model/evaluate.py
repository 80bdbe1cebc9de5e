"""Held-out evaluation of an exported model folder, through ONNX Runtime and our engine
(no PyTorch): perplexity against a unigram baseline, and single-line FIM exact match."""

from __future__ import annotations

import io
import math
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from tools.default_model.corpus import SourceFile


@dataclass(frozen=True)
class Perplexity:
    tokens: int
    model_ppl: float
    unigram_ppl: float

    @property
    def ratio(self) -> float:
        return self.unigram_ppl / self.model_ppl


def _session(model_dir: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(model_dir / "model.onnx"), opts,
                                providers=["CPUExecutionProvider"])


def _window_logprobs(sess: ort.InferenceSession, ids: list[int], head_size: int) -> np.ndarray:
    """log p(ids[i] | ids[:i]) for i >= 1, one cache-free pass."""
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, len(ids)), np.int64),
    }
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values."):
            feeds[inp.name] = np.zeros((1, int(inp.shape[1]), 0, head_size), np.float32)
    logits = sess.run(["logits"], feeds)[0][0, :-1].astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logz = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    return logits[np.arange(len(ids) - 1), ids[1:]] - logz


def unigram_logprobs(tok: Tokenizer, train: tuple[SourceFile, ...]) -> np.ndarray:
    """Add-one smoothed unigram log-probabilities fitted on the training files."""
    counts: np.ndarray = np.ones(tok.get_vocab_size(), np.float64)
    for enc in tok.encode_batch([f.text for f in train], add_special_tokens=False):
        np.add.at(counts, np.array(enc.ids, np.int64), 1.0)
    result: np.ndarray = np.log(counts / counts.sum())
    return result


def perplexity(model_dir: Path, tok: Tokenizer, train: tuple[SourceFile, ...],
               heldout: tuple[SourceFile, ...], context: int, head_size: int,
               threads: int = 2) -> Perplexity:
    """Per-token perplexity on held-out files in non-overlapping ``context`` windows (the
    first token of each window is context only), model vs unigram on the same tokens."""
    sess = _session(model_dir, threads)
    unigram = unigram_logprobs(tok, train)
    model_nll = uni_nll = 0.0
    count = 0
    for enc in tok.encode_batch([f.text for f in heldout], add_special_tokens=False):
        ids = list(enc.ids)
        for start in range(0, len(ids) - 1, context):
            window = ids[start: start + context]
            if len(window) < 2:
                continue
            model_nll -= float(_window_logprobs(sess, window, head_size).sum())
            uni_nll -= float(unigram[np.array(window[1:])].sum())
            count += len(window) - 1
    return Perplexity(count, math.exp(model_nll / count), math.exp(uni_nll / count))


@dataclass(frozen=True)
class FimHole:
    path: str
    prefix: str
    suffix: str
    line: str  # the expected middle, without its newline
    kind: str = "code"  # "prose": a comment-only line or a line inside a multi-line string


def prose_lines(text: str) -> set[int]:
    """0-based indexes of the lines of ``text`` that hold prose rather than code: lines that
    are only a comment, every line of a string that is a statement of its own (docstrings),
    and the inner lines of any other multi-line string. Text that does not tokenize has no
    prose lines."""
    prose: set[int] = set()
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return set()
    for k, tok in enumerate(toks):
        (row, col), (end_row, _) = tok.start, tok.end
        if tok.type == tokenize.COMMENT and not tok.line[:col].strip():
            prose.add(row - 1)
        elif tok.type == tokenize.STRING:
            alone = not tok.line[:col].strip() and k + 1 < len(toks) \
                and toks[k + 1].type == tokenize.NEWLINE
            prose.update(range(row - 1 if alone else row, end_row))
    return prose


@dataclass(frozen=True)
class FimResult:
    n: int
    exact: int
    per_hole: tuple[tuple[FimHole, str, bool], ...]

    @property
    def rate(self) -> float:
        return self.exact / self.n if self.n else 0.0

    def by_kind(self, kind: str) -> tuple[int, int]:
        """(exact, n) over the holes of one kind ("code" or "prose")."""
        rows = [ok for hole, _, ok in self.per_hole if hole.kind == kind]
        return sum(rows), len(rows)


def _clip_prefix(tok: Tokenizer, text: str, budget: int) -> str:
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        used += len(tok.encode(line, add_special_tokens=False).ids)
        if used > budget:
            break
        kept.append(line)
    return "".join(reversed(kept))


def _clip_suffix(tok: Tokenizer, text: str, budget: int) -> str:
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        used += len(tok.encode(line, add_special_tokens=False).ids)
        if used > budget:
            break
        kept.append(line)
    return "".join(kept)


def fim_holes(tok: Tokenizer, files: tuple[SourceFile, ...], n: int, seed: int,
              prefix_tokens: int = 300, suffix_tokens: int = 150) -> list[FimHole]:
    """``n`` random non-blank lines of ``files`` (files weighted by line count), each with
    its prefix and suffix clipped at line boundaries to fit the token budgets."""
    rng = np.random.default_rng(seed)
    prose = {f.path: prose_lines(f.text) for f in files}
    candidates = [(f, i) for f in files
                  for i, line in enumerate(f.text.split("\n")) if line.strip()]
    picks = rng.choice(len(candidates), size=min(n, len(candidates)), replace=False)
    holes = []
    for k in sorted(int(p) for p in picks):
        item, index = candidates[k]
        lines = item.text.split("\n")
        prefix = "".join(line + "\n" for line in lines[:index])
        suffix = "\n".join(lines[index + 1:])
        holes.append(FimHole(item.path, _clip_prefix(tok, prefix, prefix_tokens),
                             _clip_suffix(tok, suffix, suffix_tokens), lines[index],
                             "prose" if index in prose[item.path] else "code"))
    return holes


def fim_exact_match(model_dir: Path, holes: list[FimHole], order: str = "psm",
                    max_new_tokens: int = 48, threads: int = 2) -> FimResult:
    """Greedy infill of each hole through the engine's FIM path; stop at a newline or a FIM
    stop token; exact match of the first line after stripping trailing whitespace.
    ``order`` "none": the prefix alone as a plain prompt (next-line prediction without the
    suffix, the baseline that shows what the suffix adds); "auto": ``Engine.fim_request``
    in the model's own layout for a one-line answer (the prefix-only layout for a model
    without FIM tokens), what the Code pane and ``/infill`` get."""
    engine = Engine.load(model_dir, EngineConfig(intra_op_threads=threads))
    options = GenerateOptions(max_new_tokens=max_new_tokens, temperature=0.0,
                              stop_sequences=("\n",))
    rows = []
    try:
        for hole in holes:
            if order == "auto":  # the model's own layout, as the Code pane gets it
                request = engine.fim_request(hole.prefix, hole.suffix, GenerateOptions(
                    max_new_tokens=max_new_tokens, temperature=0.0), lines="single")
            elif order == "none":
                ids = tuple(engine.tokenizer.encode(hole.prefix))
                if not ids:  # a hole on a file's first line: nothing to continue from
                    rows.append((hole, "", False))
                    continue
                request = GenerateRequest(token_ids=ids, options=options)
            else:
                request = engine.fim_request(hole.prefix, hole.suffix, options,
                                             order="spm" if order == "spm" else "psm")
            text = engine.generate(request).text.split("\n")[0]
            rows.append((hole, text, text.rstrip() == hole.line.rstrip()))
            if len(rows) % 50 == 0:  # progress: a run takes minutes
                print(f"{order}: {len(rows)}/{len(holes)} holes, "
                      f"{sum(ok for _, _, ok in rows)} exact", file=sys.stderr, flush=True)
    finally:
        engine.close()
    return FimResult(len(rows), sum(ok for _, _, ok in rows), tuple(rows))
