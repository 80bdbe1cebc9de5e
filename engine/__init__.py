"""A text-generation engine on ONNX Runtime. Public API only."""

from engine.api import GenerateEvent, GenerateRequest, GenerateResult, Timings
from engine.config import EngineConfig, GenerateOptions
from engine.engine import Engine
from engine.errors import (
    CancelledError,
    ContextOverflowError,
    EngineError,
    InvalidOptionError,
    InvalidPromptError,
    ModelLoadError,
    ResourceLimitError,
    RuntimeSelectionError,
    TokenizerError,
    UnsupportedModelError,
)
from engine.stopping import FinishReason
from engine.tokenizer import ChatMessage

__all__ = [
    "CancelledError",
    "ChatMessage",
    "ContextOverflowError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "GenerateEvent",
    "GenerateOptions",
    "GenerateRequest",
    "GenerateResult",
    "InvalidOptionError",
    "InvalidPromptError",
    "ModelLoadError",
    "ResourceLimitError",
    "RuntimeSelectionError",
    "Timings",
    "TokenizerError",
    "UnsupportedModelError",
]
