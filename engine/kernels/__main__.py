"""`python -m engine.kernels [--json]`: whether this install runs the engine's own kernels,
and if not, why and how to fix it (engine.kernels.status). Exit code 0 when they are ready,
1 when not (ONNX Runtime's kernels run instead: the engine works, slower)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from engine.kernels import status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.kernels", description=__doc__)
    parser.add_argument("--json", action="store_true", help="every field, as JSON")
    args = parser.parse_args(argv)
    found = status()
    print(json.dumps(found.as_dict(), indent=2) if args.json else found.line())
    return 0 if found.ready else 1


if __name__ == "__main__":
    raise SystemExit(main())
