"""The bundle's entry point: the app, or (``--worker ARGS``) the engine's command line.

PyInstaller runs this file as ``__main__``; everything else is app/__main__.py.
"""

from __future__ import annotations

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
