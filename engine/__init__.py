"""A text-generation engine on ONNX Runtime. Public API only."""

from engine.api import GenerateEvent, GenerateRequest, GenerateResult, Timings
from engine.config import ConstraintSpec, EngineConfig, GenerateOptions, JsonConstraintSpec
from engine.engine import Engine
from engine.errors import (
    CancelledError,
    ConstraintError,
    ContextOverflowError,
    EngineError,
    InvalidOptionError,
    InvalidPromptError,
    ModelLoadError,
    ResourceLimitError,
    RuntimeSelectionError,
    SamplerError,
    TokenizerError,
    UnsupportedModelError,
)
from engine.sampling import CustomSampler, SamplerContext
from engine.stopping import FinishReason
from engine.tokenizer import ChatMessage

__all__ = [
    "CancelledError",
    "ChatMessage",
    "ConstraintError",
    "ConstraintSpec",
    "ContextOverflowError",
    "CustomSampler",
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
    "JsonConstraintSpec",
    "ModelLoadError",
    "ResourceLimitError",
    "RuntimeSelectionError",
    "SamplerContext",
    "SamplerError",
    "Timings",
    "TokenizerError",
    "UnsupportedModelError",
]
