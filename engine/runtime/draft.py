"""A draft model for speculative decoding (speculative_mode="draft_model"): its runner,
after checking it speaks the target's tokenizer."""

from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.model.io_spec import IOSpec, resolve_io
from engine.model.model_dir import ModelDir, load_model_dir
from engine.runtime.decode import runner_factory
from engine.runtime.providers import make_session, pruned_graph
from engine.runtime.runner import DecodeRunner
from engine.text.tokenizer import Tokenizer


class Target(Protocol):
    """The target model a draft serves."""

    model: ModelDir
    tokenizer: Tokenizer
    spec: IOSpec
    config: EngineConfig
    context_length: int


def load_draft_runner(path: str, target: Target, provider: str) -> DecodeRunner:
    """A draft model's runner; its tokenizer must be the target's (same token texts) and
    its vocabulary no larger."""
    draft = load_model_dir(path)
    texts = Tokenizer.from_dir(draft.path).token_texts()
    if texts != target.tokenizer.token_texts():
        raise ModelLoadError(
            f"the draft model {draft.path} has another tokenizer than {target.model.path}",
            hint="use a draft model of the same family (same tokenizer.json)")
    spec = resolve_io(draft.graph.inputs, draft.graph.outputs, draft.declared,
                      has_gqa=draft.graph.has_gqa, source=draft.format)
    if spec.vocab_size > target.spec.vocab_size:
        raise ModelLoadError(
            f"the draft model's vocabulary ({spec.vocab_size}) is larger than the "
            f"target's ({target.spec.vocab_size})", hint="use a draft of the same family")
    # the draft catches up on the history in one run per proposal: its head for the last
    # row only, as the target's (engine.model.graph_passes)
    graph, spec, _ = pruned_graph(draft.model_file, spec, target.config, provider,
                                  draft.graph.op_counts.get("GroupQueryAttention", 0),
                                  draft.graph.op_counts.get("MatMulNBits", 0))
    session, _ = make_session(draft.model_file, target.config, provider=provider,
                              graph=graph)
    context = min(draft.context_length, target.context_length)
    return runner_factory(session, spec, context, 1)()
