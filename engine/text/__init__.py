"""Text in and out of the model: tokenizer, chat template, FIM layouts, tool calls."""
