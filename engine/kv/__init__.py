"""The KV cache: pages and refcounts, prefix reuse, sessions, quantization, the tiered store."""
