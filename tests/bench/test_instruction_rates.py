"""bench.instruction_rates: builds its C program and reports each instruction it measures."""

from __future__ import annotations

import shutil

import pytest

from bench import instruction_rates


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (apt-get install gcc)")
def test_each_instruction_gets_a_rate_or_is_said_to_be_missing(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert instruction_rates.main(["--iterations", "400000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("clock (a chain of dependent adds): ")
    assert float(lines[0].split(": ")[1].split()[0]) > 0
    rows = lines[1:]
    assert [row.split(" zmm")[0] for row in rows] == ["VFMADD231PS", "VDPBF16PS", "VPDPBUSD",
                                                     "VPDPWSSD"]
    for row in rows:
        assert row.endswith("not on this CPU") or " ns each, " in row, row
