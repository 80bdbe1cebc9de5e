"""From a Catalog click to a streamed chat answer with the pulled model, in the real app,
under Xvfb; writes two screenshots:

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python tools/catalog_demo.py

- ``docs/screenshots/catalog.png``: the Models page's Catalog tab with its fit labels on
  this machine, under a host RAM limit of 448 MiB set in the app's settings;
- ``docs/screenshots/catalog-pulled-chat.png``: after **Get** on the first row (the best
  GGUF that fits, downloaded, converted, loaded), the chat's streamed answer from it.

No Hub is reached: the test suite's Hub stand-in (tests/app/hub_standin.py) serves, on
127.0.0.1, three forged repositories (random weights, so the answer is gibberish): the
four-quantization GGUF decoder of the pull tests (labelled "fits"), an ONNX decoder with a
32,768-token context whose KV does not fit under the limit ("fits with a shorter context
(N tokens)", loaded with N), and an ONNX repository whose weights file, a sparse 600 MB
file that is listed and never downloaded, is over the limit ("too big"). The catalog
entries for them are made here; the app, the worker, the download, the conversion and the
load are the real ones. A throwaway app home keeps your chats and settings untouched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.screenshots import wait_until  # noqa: E402  (the checkout first on the path)

LIMIT = "448MiB"
BIG_BYTES = 600 * 1000 * 1000
SOURCE = "https://huggingface.co/forge (the Hub stand-in of the test suite)"


def forge_repos(root: Path) -> tuple[dict[str, Path], tuple[Any, ...]]:
    """The stand-in's repositories and the catalog entries naming them."""
    from engine.hub import CatalogEntry
    from tests.app.test_catalog_panel import LONG
    from tests.engine.hub.repos import GGUF_REPO, gguf_repo, onnx_repo

    tiny = gguf_repo(root / "tiny")
    long = onnx_repo(root / "long", LONG)
    big = root / "big" / "onnx-repo"
    shutil.copytree(long, big)
    with open(big / "model.onnx.data", "r+b") as f:  # sparse: listed, never downloaded
        f.truncate(BIG_BYTES)
    repos = {GGUF_REPO: tiny, "forge/long-context-onnx": long, "forge/big-onnx": big}

    def entry(name: str, title: str, kind: str, fmt: str, repo: str, params: str,
              quant: str, context: int, fim: str | None) -> CatalogEntry:
        return CatalogEntry(name, title, kind, "small", fmt, repo, "",
                            "*.gguf" if fmt == "gguf" else "", params, quant, context,
                            "apache-2.0", fim, False, False, SOURCE)

    entries = (
        entry("tiny-chat", "Tiny chat (forged GGUF)", "chat", "gguf", GGUF_REPO, "0.01B",
              "best that fits (Q4_K_M when several do)", 256, None),
        entry("long-context", "Long context (forged ONNX)", "chat", "onnx",
              "forge/long-context-onnx", "0.01B", "fp32", LONG.context, None),
        entry("big-model", "Big model (forged ONNX, sparse weights)", "chat", "onnx",
              "forge/big-onnx", "0.15B", "fp32", LONG.context, None),
    )
    return repos, entries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    os.environ["ONNX_LOCAL_LLM_HOME"] = tempfile.mkdtemp(prefix="catalog-demo-")
    work = Path(tempfile.mkdtemp(prefix="catalog-demo-repos-"))
    from PySide6.QtWidgets import QApplication

    from app.context import AppContext
    from app.launch import choose_model
    from app.paths import AppPaths
    from app.store import ChatStore
    from app.views.download_panel import ENDPOINT_KEY
    from app.views.main_window import MainWindow
    from engine.hub import CatalogRow
    from tests.app.hub_standin import HubStandin

    repos, entries = forge_repos(work)
    hub = HubStandin(repos)
    app = QApplication(sys.argv[:1])
    ctx = AppContext(AppPaths.default())
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value(ENDPOINT_KEY, hub.url)
    ctx.settings.set_value("limits/host_ram", LIMIT)
    ctx.settings.set_value("chat/sampling", {"temperature": 1.0, "max_tokens": 40, "seed": 7})
    ctx.store = ChatStore(ctx.paths.chats_db)
    window = MainWindow(ctx)
    window.resize(1360, 860)
    window.show()
    ctx.start_local(choose_model(None, ""))
    window.attach_worker()
    try:
        if not wait_until(app, lambda: ctx.model is not None, 120):
            print("the worker did not come up", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        models: Any = window.show_view("models")
        panel = models.catalog
        panel.entries = entries
        panel.rows = [CatalogRow(e, None, "not checked yet") for e in entries]
        panel._fill()
        models.tabs.setCurrentWidget(panel)  # shown: reads the Hub (stand-in)
        if not wait_until(app, lambda: panel.check_job is None
                          and panel.rows[0].problem != "not checked yet", 300):
            print("the catalog was not checked", file=sys.stderr)
            return 1
        panel.table.selectRow(0)
        wait_until(app, lambda: False, 0.5)
        window.grab().save(str(args.out / "catalog.png"))
        print(f"wrote {args.out / 'catalog.png'}")
        for i in range(panel.table.rowCount()):
            print(" | ".join(panel.table.item(i, j).text()
                             for j in range(panel.table.columnCount())))
        panel.get_button.click()
        if not wait_until(app, lambda: panel.status.text().startswith(("Loaded", "Could"))
                          or (panel.pull_job is None
                              and not panel.status.text().startswith(("Took", "Getting"))),
                          600):
            print("the Get did not end", file=sys.stderr)
            return 1
        print(panel.status.text())
        if not panel.status.text().startswith("Loaded"):
            return 1
        wait_until(app, lambda: "tiny-chat" in str((ctx.model or {}).get("id")), 60)
        chat: Any = window.show_view("chat")
        chat.send("Hello! Which model are you?")
        wait_until(app, lambda: not chat.answering, 120)
        wait_until(app, lambda: False, 1.0)
        window.grab().save(str(args.out / "catalog-pulled-chat.png"))
        model = (ctx.model or {}).get("id")
        print(f"wrote {args.out / 'catalog-pulled-chat.png'} (model {model})")
        return 0
    finally:
        ctx.shutdown()
        hub.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
