"""Entry point of the desktop app."""

from __future__ import annotations

import sys


def main() -> int:
    # The window arrives with the GUI issue; until then say so plainly.
    print("GUI not built yet: try `python -m engine generate --model DIR --chat 'hello'`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
