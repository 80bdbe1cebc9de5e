"""ONNX Runtime: providers, session options, decode runners, device KV, CUDA graphs, huge pages."""
