"""Tokens and text: the tokenizer, chat templates, FIM layouts (token families and prefix-only)."""
