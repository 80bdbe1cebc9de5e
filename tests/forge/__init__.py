"""The forge: tiny ONNX decoder-only LLMs and a BPE tokenizer, built in code for tests.

Three layouts share the same deterministic weights for the same :class:`ForgeSpec`, so they
produce the same greedy tokens: onnxruntime-genai (GroupQueryAttention), optimum (standard
ops, growing KV) and static cache (fixed ``[1, kv_heads, max_len, head_dim]`` KV).
"""

from tests.forge.common import ForgeSpec, ForgeWeights, make_weights
from tests.forge.genai import genai_config, write_genai_model
from tests.forge.optimum import write_optimum_model
from tests.forge.quant import quantize_int4
from tests.forge.reference_loop import (
    detect_layout,
    og_greedy,
    reference_greedy,
    reference_logits,
)
from tests.forge.static import write_static_model
from tests.forge.tokenizer import (
    CHAT_TEMPLATE,
    EOS_TOKEN_ID,
    SPECIAL_TOKENS,
    load_tokenizer,
    make_tokenizer_files,
)

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN_ID",
    "SPECIAL_TOKENS",
    "ForgeSpec",
    "ForgeWeights",
    "detect_layout",
    "genai_config",
    "load_tokenizer",
    "make_tokenizer_files",
    "make_weights",
    "og_greedy",
    "quantize_int4",
    "reference_greedy",
    "reference_logits",
    "write_genai_model",
    "write_optimum_model",
    "write_static_model",
]
