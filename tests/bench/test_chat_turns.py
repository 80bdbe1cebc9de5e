"""bench.chat_turns in its quick mode, our worker only: the llama.cpp arms are left out
cleanly when its bench-only venv is missing, and the report holds what the table needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import chat_turns


def test_quick_chat_without_llama_cpp(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "chat_turns.json"
    assert chat_turns.main(["--quick", "--peers-python", str(tmp_path / "no-venv" / "python"),
                            "--out", str(out)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert "llama.cpp left out" in report["skipped"]
    assert set(report["arms"]) == {"ours", "ours-cold"}
    turns = {row["turn"]: row for row in report["turns"]}
    assert list(turns) == ["1", "2", "3", "4", "5"]
    # each turn reuses the history before it; the fifth (oldest exchange left out) too
    for turn, before in (("2", "1"), ("3", "2"), ("4", "3")):
        assert turns[turn]["ours_reused"] >= turns[before]["prompt_tokens"], turns[turn]
    assert turns["5"]["ours_reused"] > turns["5"]["prompt_tokens"] // 2, turns["5"]
    cold = report["arms"]["ours-cold"]["turns"]
    assert all(cold[t]["cached_tokens"] < 16 for t in turns), cold  # the control reuses nothing
    assert report["arms"]["ours"]["peak_rss_mib"] > 0
    assert report["arms"]["ours"]["kv_bytes_per_token"] > 0
    assert "ours turn 5 / turn 4 (<= 0.5)" in report["targets"]
    printed = capsys.readouterr().out
    assert "| 5 |" in printed and "peak RSS" in printed
