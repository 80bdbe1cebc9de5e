"""The Python versions the project claims are the ones it tests.

CI tests ``CI_PYTHON`` with the whole suite (.ci/run) and each of ``VERSIONS`` with a smoke
subset (.ci/other_pythons); pyproject.toml's requires-python, its classifiers, ruff's
target-version and mypy's python_version must say the same range.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "other_pythons"


def _script_value(name: str) -> str:
    found = re.search(rf'^{name}="?([^"\n]*)"?$', SCRIPT.read_text(encoding="utf-8"),
                      re.MULTILINE)
    assert found, f"{SCRIPT.relative_to(ROOT)} sets no {name}"
    return found.group(1)


def _tested_versions() -> list[tuple[int, int]]:
    names = [_script_value("CI_PYTHON"), *_script_value("VERSIONS").split()]
    return sorted(tuple(int(p) for p in n.split(".")) for n in names)  # type: ignore[misc]


def test_the_claimed_range_is_the_tested_one():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = config["project"]
    tested = _tested_versions()
    lowest = ".".join(map(str, tested[0]))
    classified = sorted(tuple(int(p) for p in c.rsplit(" ", 1)[1].split("."))
                        for c in project["classifiers"]
                        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert classified == tested, "the classifiers name other versions than CI tests"
    claimed = SpecifierSet(project["requires-python"])
    assert Version(lowest) in claimed, project["requires-python"]
    below = Version(f"{tested[0][0]}.{tested[0][1] - 1}")
    assert below not in claimed, f"requires-python admits {below}, which CI does not test"
    assert config["tool"]["ruff"]["target-version"] == "py" + lowest.replace(".", "")
    assert config["tool"]["mypy"]["python_version"] == lowest


def test_the_tested_versions_are_consecutive_and_the_smoke_files_exist():
    tested = _tested_versions()
    assert [minor for _, minor in tested] == list(range(tested[0][1], tested[-1][1] + 1))
    listed = re.search(r"^SMOKE=\((.*?)^\)", SCRIPT.read_text(encoding="utf-8"),
                       re.MULTILINE | re.DOTALL)
    assert listed
    files = listed.group(1).split()
    assert files and all((ROOT / f).is_file() for f in files), files


def test_ci_runs_the_other_versions():
    """The claimed versions beyond CI's own are tested by every CI run, not by hand."""
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/other_pythons" in run
