"""Model folders: what they hold, how to read them, and GGUF import."""
