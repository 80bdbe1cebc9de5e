"""The PySide6 desktop app (see DESIGN.md). It talks to the engine worker over HTTP only."""
