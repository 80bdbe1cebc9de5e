"""``python -m engine catalog`` and ``python -m engine pull``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import platformdirs

from engine.config import EngineConfig

APP_NAME = "onnx-local-llm"


def default_models_dir() -> Path:
    """The app's library folder (where its downloads go), so a pulled model shows there."""
    override = os.environ.get("ONNX_LOCAL_LLM_HOME")
    root = Path(override) / "data" if override else Path(platformdirs.user_data_dir(APP_NAME))
    return root / "models"


def add_arguments(sub: argparse._SubParsersAction) -> None:
    cat = sub.add_parser("catalog", help="list the curated models and whether each fits here",
                         description="List the curated chat, code and reasoning models with "
                         "what this machine would get of each (read from the Hub: file sizes "
                         "and the model's config) and its fit label under the memory limits.")
    pull = sub.add_parser("pull", help="download a model into the library (GGUF converted)",
                          description="Download a catalog model or a Hub repository into a "
                          "model folder: the best GGUF that fits (Q4_K_M when several do) is "
                          "converted by the importer; an ONNX export is taken as it is. "
                          "Honours HF_ENDPOINT.")
    pull.add_argument("spec", metavar="NAME|REPO[:FILE]",
                      help="a catalog name (python -m engine catalog), owner/name, or "
                      "owner/name:FILE.gguf / owner/name:Q8_0")
    pull.add_argument("--models-dir", metavar="DIR", type=Path,
                      help="the library folder to pull into (default: the app's, "
                      f"{default_models_dir()}); `serve --models-dir DIR` lists it")
    pull.add_argument("--quiet", action="store_true",
                      help="no progress lines (default: print them to stderr)")
    for p in (cat, pull):
        p.add_argument("--endpoint", metavar="URL", default="",
                       help="the Hub (default: $HF_ENDPOINT, else https://huggingface.co)")
        p.add_argument("--host-ram-limit", metavar="LIMIT", default="auto",
                       help="RAM limit the label is judged by (default auto)")
        p.add_argument("--vram-limit", metavar="LIMIT", default="auto",
                       help="GPU memory limit the label is judged by (default auto)")
    cat.add_argument("--json", action="store_true", help="print JSON (default: a table)")


def _config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(host_ram_limit=args.host_ram_limit, vram_limit=args.vram_limit)


def catalog(args: argparse.Namespace) -> int:
    from engine.hub.bandwidth import read_speed
    from engine.hub.browse import catalog_rows

    rows = catalog_rows(endpoint=args.endpoint, config=_config(args), bandwidth=read_speed)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    print(f"{'NAME':34} {'KIND':9} {'FORMAT':6} {'TAKES':26} {'SIZE':>9}  LABEL HERE")
    for r in rows:
        e = r.entry
        if r.choice is None:
            print(f"{e.name:34} {e.kind:9} {e.format:6} {'-':26} {'-':>9}  {r.problem}")
            continue
        c = r.choice
        speed = (f", about {c.fit.tokens_per_second:.0f} tok/s" if c.fit.tokens_per_second
                 else "")
        size = f"{c.download_bytes / 2**30:.2f}GiB"
        print(f"{e.name:34} {e.kind:9} {e.format:6} {c.quant[:26]:26} {size:>9}  "
              f"{c.fit.text}{speed}")
    if rows and all(r.choice is None for r in rows):
        print("(no label: the Hub was not reached; python -m engine catalog --json still "
              "lists the entries)", file=sys.stderr)
    return 0


def pull(args: argparse.Namespace) -> int:
    from engine.hub.bandwidth import read_speed
    from engine.hub.download import DownloadCancelled, DownloadError
    from engine.hub.pull import PullEvent
    from engine.hub.pull import pull as run_pull

    last = [""]

    def show(event: PullEvent) -> None:
        if args.quiet:
            return
        if event.total:
            pct = 100 * (event.completed or 0) // max(event.total, 1)
            line = f"{event.status}: {pct}% of {event.total / 2**20:.1f} MiB"
        else:
            line = event.status
        if line != last[0]:
            last[0] = line
            print(line, file=sys.stderr, flush=True)

    try:
        result = run_pull(args.spec, args.models_dir or default_models_dir(),
                          endpoint=args.endpoint, config=_config(args), progress=show,
                          bandwidth=read_speed)
    except DownloadCancelled:
        print("error: cancelled; pull again to continue where it stopped", file=sys.stderr)
        return 130
    except DownloadError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(result.summary)
    return 0
