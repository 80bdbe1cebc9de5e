"""The worker: `python -m engine serve` (one module per dialect)."""
