"""Search the Hub for what the catalog lacks: huggingface_hub's model search
(``HfApi.list_models``), kept to what this engine runs — repositories tagged ``gguf`` or
``onnx`` whose task, when they name one, is text generation — most downloaded first. The
labels come from :func:`engine.hub.browse.catalog_rows`, as for the catalog's entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.hub.catalog import CatalogEntry
from engine.hub.download import hub_endpoint

LIBRARIES = ("gguf", "onnx")


@dataclass(frozen=True)
class SearchHit:
    repo: str
    format: str  # gguf | onnx
    downloads: int

    def entry(self) -> CatalogEntry:
        """The hit as a catalog entry (unknown facts left blank), to label and pull."""
        return CatalogEntry(self.repo, self.repo, "chat", "small", self.format, self.repo, "",
                            "*.gguf" if self.format == "gguf" else "", "?B", "as published",
                            0, "see the model card", None, False, False,
                            f"https://huggingface.co/{self.repo}")


def search_hub(query: str, *, endpoint: str = "", limit: int = 20) -> list[SearchHit]:
    from huggingface_hub import HfApi

    text = query.strip()
    if not text:
        return []
    api = HfApi(endpoint=hub_endpoint(endpoint))
    hits: dict[str, SearchHit] = {}
    for library in LIBRARIES:
        for info in api.list_models(search=text, filter=library, sort="downloads",
                                    limit=limit):
            task = getattr(info, "pipeline_tag", None)
            if task not in (None, "text-generation") or info.id in hits:
                continue
            hits[info.id] = SearchHit(info.id, library, int(getattr(info, "downloads", 0) or 0))
    return sorted(hits.values(), key=lambda h: -h.downloads)[:limit]
