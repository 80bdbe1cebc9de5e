"""Training, export and evaluation of the small default code model shipped in
``tools/models/default-coder`` (a development tool: needs PyTorch, not part of the app)."""
