"""One generation: the request, logits processors, sampling, stopping, constraints."""
