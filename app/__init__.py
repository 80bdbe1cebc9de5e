"""The PySide6 desktop app (README, "The desktop app"). It talks to the engine worker over HTTP
only."""
