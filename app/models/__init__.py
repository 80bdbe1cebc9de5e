"""Qt item models over the app's data (conversations, ...)."""
