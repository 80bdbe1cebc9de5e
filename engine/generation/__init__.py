"""The token loop: requests, logits processors, samplers, stopping, constraints, speculation."""
