"""A forged model that follows a script: a fixed logit bias per sequence position.

``script_model`` rewrites a forged onnxruntime-genai folder so its logits at position
``p`` (the token fed there) get ``table[p]`` added: a test says which token the model
wants at each step (and which it would take second), whatever came before. Positions are
counted from the attention mask, so prefill chunks, KV reuse and single decode steps all
see the same script.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine import Engine, EngineConfig
from engine.text.tokenizer import Tokenizer
from tests.engine.server.live import strip_fim
from tests.forge import write_genai_model

#: Far above a forged model's own logits: the script decides.
FIRST, SECOND = 1000.0, 500.0

Choice = int | Mapping[int, float]


def script_model(folder: Path, table: np.ndarray) -> Path:
    """Add ``table[position]`` (shape ``[context, vocab]``) to the model's logits."""
    path = folder / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    producer = next(n for n in graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "script/base_logits"
    graph.initializer.extend([
        numpy_helper.from_array(table.astype(np.float32), "script/table"),
        numpy_helper.from_array(np.array([1], np.int64), "script/axis1"),
        numpy_helper.from_array(np.array(1, np.int64), "script/one"),
        numpy_helper.from_array(np.array(0, np.int64), "script/zero"),
        numpy_helper.from_array(np.array(table.shape[0] - 1, np.int64), "script/last"),
    ])
    graph.node.extend([
        helper.make_node("ReduceSum", ["attention_mask", "script/axis1"], ["script/total"],
                         keepdims=1),  # [batch, 1]
        helper.make_node("Shape", ["input_ids"], ["script/shape"]),
        helper.make_node("Gather", ["script/shape", "script/one"], ["script/seq"], axis=0),
        helper.make_node("Range", ["script/zero", "script/seq", "script/one"], ["script/ar"]),
        helper.make_node("Sub", ["script/total", "script/seq"], ["script/start"]),
        helper.make_node("Add", ["script/start", "script/ar"], ["script/pos"]),  # [b, seq]
        helper.make_node("Min", ["script/pos", "script/last"], ["script/clamped"]),
        helper.make_node("Gather", ["script/table", "script/clamped"], ["script/bias"], axis=0),
        helper.make_node("Add", ["script/base_logits", "script/bias"], ["logits"]),
    ])
    assert graph.input[0].type.tensor_type.elem_type == TensorProto.INT64
    onnx.save_model(model, str(path))
    return folder


def make_table(context: int, vocab: int, scripts: Sequence[tuple[int, Sequence[Choice]]]
               ) -> np.ndarray:
    """A script table: each ``(prompt_len, choices)`` says what the model wants for the
    generated tokens of a prompt of ``prompt_len`` tokens (a token id, or ids with
    weights: ``{newline: FIRST, x: SECOND}``)."""
    table = np.zeros((context, vocab), np.float32)
    for prompt_len, choices in scripts:
        for step, choice in enumerate(choices):
            row = table[prompt_len - 1 + step]
            assert not row.any(), f"two scripts want position {prompt_len - 1 + step}"
            for token, weight in ({choice: FIRST} if isinstance(choice, int)
                                  else choice).items():
                row[token] = weight
    return table


def spell(tokenizer: Tokenizer, *pieces: str) -> list[int]:
    """The ids of ``pieces``, each one token (a test script names tokens by text)."""
    ids = []
    for piece in pieces:
        found = tokenizer.encode(piece, parse_special=False)
        assert len(found) == 1, f"{piece!r} is {len(found)} tokens in the forge's vocabulary"
        ids += found
    return ids


@dataclass(frozen=True)
class Scenario:
    """An infill request and what the model wants for each generated token: a text of
    one token, or texts with weights (``{"\\n": FIRST, "x": SECOND}``)."""

    prefix: str
    suffix: str
    wants: tuple[str | Mapping[str, float], ...]


def write_scripted_model(folder: Path, scenarios: Sequence[Scenario]) -> list[Scenario]:
    """A forged model without FIM tokens at ``folder`` that follows every scenario; each
    comes back with its prefix padded (lines at the top) so that no two scripts share a
    position. Prompts are laid out by ``Engine.fim_request`` (no clipping at these sizes)."""
    source = write_genai_model(folder.with_name(folder.name + "-source"))
    strip_fim(source, folder)
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    tokenizer = engine.tokenizer
    placed, scripts, free = [], [], 0
    for scenario in scenarios:
        prefix = scenario.prefix
        while True:
            ids = engine.fim_request(prefix, scenario.suffix).token_ids or ()
            if len(ids) - 1 >= free:
                break
            prefix = "x = 0\n" + prefix
        wants: list[Choice] = [
            spell(tokenizer, want)[0] if isinstance(want, str)
            else {spell(tokenizer, text)[0]: weight for text, weight in want.items()}
            for want in scenario.wants]
        scripts.append((len(ids), wants))
        placed.append(Scenario(prefix, scenario.suffix, scenario.wants))
        free = len(ids) - 1 + len(wants)
    spec = engine.spec
    script_model(folder, make_table(engine.context_length, spec.vocab_size, scripts))
    return placed
