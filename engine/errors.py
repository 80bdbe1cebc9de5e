"""Typed errors. Every message says what was expected, what arrived, and how to fix it."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} (fix: {hint})" if hint else message)


class ModelLoadError(EngineError):
    """A model folder is missing files, has unreadable files, or uses what we cannot run."""


class UnsupportedModelError(ModelLoadError):
    """The model asks for a capability this runtime does not have."""


class TokenizerError(EngineError):
    """Tokenizer files are missing or invalid, or a template cannot be rendered."""


class InvalidOptionError(EngineError, ValueError):
    """A generation option or request field has a bad value."""

    def __init__(self, field: str, message: str, *, hint: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}", hint=hint)


class InvalidPromptError(EngineError, ValueError):
    """The prompt is empty or contains token ids outside the vocabulary."""


class ContextOverflowError(EngineError):
    """The prompt does not fit the model's context."""


class ResourceLimitError(EngineError):
    """A memory limit refuses the request; the message carries the numbers."""


class RuntimeSelectionError(EngineError):
    """The ONNX Runtime installation or the requested execution provider is unusable."""


class CancelledError(EngineError):
    """The request was cancelled by its caller."""


class SamplerError(EngineError):
    """A request's custom sampler raised, or returned something that is not a token id; the
    request ends, the engine stays usable."""


class ConstraintError(EngineError):
    """A constraint was not met: a token the grammar does not allow (or EOS before a
    complete answer) was forced past the constraint's mask, e.g. by a custom sampler."""
