"""The curated catalog: valid against its schema, every kind the issue names present, each
entry with its source; ``python -m engine catalog`` labels entries from the Hub and says
so plainly when the Hub cannot be reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from engine.errors import InvalidOptionError
from engine.hub.browse import catalog_rows
from engine.hub.catalog import CATALOG_FILE, CatalogEntry, load_catalog, parse_catalog
from engine.hub.fit import FITS
from tests.app.hub_standin import HubStandin
from tests.engine.hub.repos import gguf_repo

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = CATALOG_FILE.with_name("catalog.schema.json")


def test_the_catalog_file_is_valid_against_its_schema():
    document = json.loads(CATALOG_FILE.read_text())
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert len(load_catalog()) == len(document["models"])


def test_the_catalog_has_every_kind_of_model_asked_for():
    entries = load_catalog()
    by = {(e.kind, e.format) for e in entries}
    assert {("chat", "gguf"), ("chat", "onnx"), ("code", "gguf"),
            ("reasoning", "gguf"), ("reasoning", "onnx")} <= by
    coders = [e for e in entries if e.fim == "qwen"]
    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-7b",
            "qwen2.5-coder-7b-instruct"} <= {e.name for e in coders}
    assert any(e.reasoning and e.name.startswith("qwen3") for e in entries)
    assert any(e.reasoning and "deepseek-r1-distill-qwen" in e.name for e in entries)
    assert any(e.tools for e in entries)
    assert {"small", "medium"} == {e.size for e in entries}
    for e in entries:  # where each came from; never file sizes or hashes
        assert e.source.startswith("https://huggingface.co/")
        assert e.repo.split("/")[-1].lower() in e.source.lower() or "search" in e.source


def test_a_malformed_entry_is_refused_naming_the_entry_and_the_field():
    good = json.loads(CATALOG_FILE.read_text())
    bad = json.loads(json.dumps(good))
    bad["models"][1]["context"] = "long"
    with pytest.raises(InvalidOptionError, match=r"models\[1\].*'context'"):
        parse_catalog(bad)
    bad = json.loads(json.dumps(good))
    bad["models"][0]["format"] = "safetensors"
    with pytest.raises(InvalidOptionError, match="format must be one of onnx, gguf"):
        parse_catalog(bad)
    bad = json.loads(json.dumps(good))
    bad["models"].append(dict(bad["models"][0]))
    with pytest.raises(InvalidOptionError, match="names used twice"):
        parse_catalog(bad)


def test_catalog_rows_label_entries_from_the_hub(tmp_path):
    entry = CatalogEntry("tiny", "Tiny", "code", "small", "gguf", "forge/Tiny-GGUF", "",
                         "*.gguf", "0.01B", "best that fits", 256, "apache-2.0", "qwen",
                         False, False, "https://huggingface.co/forge/Tiny-GGUF")
    with HubStandin({"forge/Tiny-GGUF": gguf_repo(tmp_path)}) as hub:
        [row] = catalog_rows(endpoint=hub.url, entries=(entry,), bandwidth=1e10)
    assert row.problem is None and row.choice is not None
    assert row.choice.quant == "Q4_K_M" and row.choice.fit.label == FITS
    assert row.as_dict()["choice"]["fit"]["text"] == "fits"


def test_cli_catalog_offline_says_the_hub_was_not_reached(tmp_path):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT),
           "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "engine", "catalog", "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert len(rows) == len(load_catalog())
    assert all(r["choice"] is None and "the Hub was not reached" in r["problem"]
               for r in rows)
    table = subprocess.run([sys.executable, "-m", "engine", "catalog"], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=600)
    assert table.returncode == 0 and "qwen2.5-coder-1.5b" in table.stdout
    assert "the Hub was not reached" in table.stdout


def test_hub_search_keeps_what_this_engine_runs_and_labels_it(tmp_path):
    from engine.hub import search_hub
    from tests.engine.hub.repos import UNSUPPORTED_REPO, unsupported_repo

    repos = {"forge/Tiny-GGUF": gguf_repo(tmp_path),
             UNSUPPORTED_REPO: unsupported_repo(tmp_path)}
    with HubStandin(repos) as hub:
        assert search_hub("forge", endpoint=hub.url) != []
        hits = search_hub("forge", endpoint=hub.url)
        assert [(h.repo, h.format) for h in hits] == [("forge/Tiny-GGUF", "gguf")]
        [row] = catalog_rows(endpoint=hub.url, entries=tuple(h.entry() for h in hits),
                             bandwidth=1e10)
    assert row.choice is not None and row.choice.quant == "Q4_K_M"
    assert row.choice.fit.label == FITS
