"""A text-generation engine on ONNX Runtime. Public API only."""

import os

# ONNX Runtime writes a device id and a telemetry event store under ~/.cache/Microsoft and
# carries an uploader; the variable, set before onnxruntime is imported, stops both (its
# disable_telemetry_events() does not). Every entry point imports this package first.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

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
from engine.generation.sampling import CustomSampler, SamplerContext
from engine.generation.stopping import FinishReason
from engine.kernels import KernelStatus, KernelUse
from engine.kernels import status as kernel_status
from engine.model.default_model import default_model_dir, resources_dir
from engine.model.folders import (
    FolderFacts,
    completeness_problem,
    find_model_dirs,
    folder_size,
    human_size,
    import_work_dir,
    inspect_folder,
    is_model_dir,
)
from engine.runtime.providers import installed_ort_variants
from engine.text.tokenizer import ChatMessage

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
    "FolderFacts",
    "GenerateEvent",
    "GenerateOptions",
    "GenerateRequest",
    "GenerateResult",
    "InvalidOptionError",
    "InvalidPromptError",
    "JsonConstraintSpec",
    "KernelStatus",
    "KernelUse",
    "ModelLoadError",
    "ResourceLimitError",
    "RuntimeSelectionError",
    "SamplerContext",
    "SamplerError",
    "Timings",
    "TokenizerError",
    "UnsupportedModelError",
    "completeness_problem",
    "default_model_dir",
    "find_model_dirs",
    "folder_size",
    "human_size",
    "import_work_dir",
    "inspect_folder",
    "installed_ort_variants",
    "is_model_dir",
    "kernel_status",
    "resources_dir",
]
