"""The window's views. Each takes the AppContext: ``View(ctx, parent=None)``."""
