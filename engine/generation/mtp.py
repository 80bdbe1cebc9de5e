"""A declared MTP head run as a speculative proposer: one guessed token per target forward.

The target runner fetches its hidden-state output with the logits; the head maps the hidden
state of the position that produced the pending token (plus, if it takes them, the
pending token's embeddings) to logits for the token after it. Verification is the usual
greedy one, so the output is plain greedy decoding's. Runs heads without their own KV
(``engine.generation.spec_heads.DeclaredHead.executable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.generation.spec_heads import DeclaredHead
from engine.runtime.providers import make_session


class MtpHead:
    def __init__(self, declared: DeclaredHead, session: Any) -> None:
        config, io = declared.config, declared.config.head_io
        assert declared.executable and config.kind == "mtp", "validated, executable heads only"
        self.hidden_output = config.target_hidden_outputs[0]
        self.hidden_size = config.hidden_size
        self._session = session
        self._hidden_input = io.hidden_input
        self._logits_output = io.logits_output
        self._embeds_input: str | None = None
        self._embed: np.ndarray | None = None
        if io.embeds_input in declared.signature.head_inputs:
            assert config.embedding_weights is not None  # checked at validation
            vocab = config.vocab_size or declared.target_vocab_size
            self._embeds_input = io.embeds_input
            self._embed = np.memmap(config.embedding_weights, dtype="<f4", mode="r",
                                    shape=(vocab, config.hidden_size))

    @classmethod
    def load(cls, declared: DeclaredHead, config: EngineConfig, provider: str) -> MtpHead:
        session, _ = make_session(declared.config.model, config, provider=provider)
        return cls(declared, session)

    def guess(self, hidden: np.ndarray, token: int) -> int | None:
        """The head's greedy token after `token`, from the hidden row that produced it (None
        when `token` is outside the head's embedding table)."""
        if self._embed is not None and token >= self._embed.shape[0]:
            return None
        feeds = {self._hidden_input: np.ascontiguousarray(hidden, dtype=np.float32)
                 .reshape(1, 1, -1)}
        if self._embeds_input is not None and self._embed is not None:
            feeds[self._embeds_input] = np.asarray(self._embed[token]).reshape(1, 1, -1)
        (logits,) = self._session.run([self._logits_output], feeds)
        logits = np.asarray(logits)
        return int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))


class MtpProposer:
    """Proposes the head's guess; `hidden` is set by the token loop after every forward."""

    def __init__(self, head: MtpHead) -> None:
        self.head = head
        self.hidden: np.ndarray | None = None

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        if self.hidden is None or k <= 0:
            return []
        guess = self.head.guess(self.hidden, int(history[-1]))
        return [] if guess is None else [guess]
