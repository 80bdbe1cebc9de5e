"""bench.peers: the held-out split of its speculative items, and its harness end to end on a
tiny forged model: our engine and onnxruntime-genai (a forged model has no GGUF, so the
llama.cpp arms, which need the bench-only venv, are not run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peers
from bench._peer_report import report
from tests.forge.common import ForgeSpec
from tests.forge.genai import write_genai_model
from tests.peers import needs_onnxruntime_genai


def test_speculative_items_are_in_no_training_set() -> None:
    assert peers.heldout_problems() == []


def test_the_split_check_catches_a_trained_on_function(monkeypatch: pytest.MonkeyPatch) -> None:
    # the function the earlier 2.70x was measured on is in the edit-training files
    monkeypatch.setattr(peers, "SPEC_SOURCES",
                        (("argparse", "HelpFormatter._format_action_invocation"),))
    problems = peers.heldout_problems()
    assert problems and "training file" in problems[0]


@needs_onnxruntime_genai
def test_harness_runs_each_workload_on_a_forged_model(tmp_path: Path) -> None:
    model = write_genai_model(tmp_path / "model", ForgeSpec(context=4096))
    prompts = peers.prepare(model, tmp_path / "out", [8, 16], 8, edits=2, file_tokens=120)
    common: dict[str, object] = {"model": str(model), "gguf": "", "threads": 1,
                                 "new_tokens": 8, "idle_s": 0.2, "prompts": str(prompts)}
    first_arms = [a for a in peers.FIRST_ARMS if peers.engine_of(a) != "llama"]
    arms = {"ours", "og", "plain", "lookup", *first_arms}
    runs = []
    for job in peers.jobs_for(list(peers.WORKLOADS), [8, 16]):
        if job["arm"] in arms:
            runs.append({**job, "round": 0, "loadavg": [0.0],
                         **peers.run_job(job, common)})
    machine = {"onnx_per_token": 1, "gguf": 1, "memcpy_read_gb_s": 1.0,
               "ort_2t_read_gb_s": 1.0}
    summary = report(runs, machine, list(peers.WORKLOADS), [8, 16])
    json.dumps(summary)  # it is written as JSON

    decode = summary["decode"]["16"]
    assert decode["ours"]["decode_tok_s"] > 0 and decode["og"]["decode_tok_s"] > 0
    assert decode["decode_tok_s_ours/og"] > 0
    # the first request after a load, at each prompt length: shipped (and its control),
    # 4 KiB pages, the CLI, og; and ours over og
    for n in ("8", "16"):
        first = summary["first"][n]
        assert set(first) - {"ratios"} == set(first_arms)
        assert all(first[a]["ttft_ms"] > 0 and first[a]["decode_tok_s"] > 0 for a in first_arms)
        assert float(first["ratios"]["decode_og"]) > 0 and float(first["ratios"]["cli_og"]) > 0
    # after a one-character edit near the end, both engines recompute only the tail
    fim = summary["fim"]
    data = json.loads(prompts.read_text())
    prompt_len = len(data["fim"][1])
    for engine in ("ours", "og"):
        assert 0 < fim[engine]["recomputed_median"] < prompt_len / 2, (engine, fim)
    assert fim["og/ours"] > 0
    streams = summary["streams"]
    assert streams["ours"]["many_tok_s"] > 0 and streams["og"]["many_tok_s"] > 0
    spec = summary["spec"]
    assert spec["edit"]["lookup/plain"] > 0 and spec["novel"]["lookup/og"] > 0
