"""The dependency ranges are the ones CI tests: ``.ci/oldest.txt`` pins every lower bound.

CI runs the whole suite on the newest versions pyproject.toml's ranges allow
(what a fresh ``pip install`` takes) and the Spark, database and S3 tests on
the oldest ones, installed with ``pip install -c .ci/oldest.txt``. This test
fails when a lower bound in pyproject.toml and the pin in that file disagree,
so neither can move without the other.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    bounds: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        for spec in req.specifier:
            if spec.operator == ">=":
                name = req.name.lower()
                assert bounds.get(name, spec.version) == spec.version, f"{name}: two lower bounds"
                bounds[name] = spec.version
    return bounds


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / ".ci" / "oldest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_oldest_pins_are_the_lower_bounds() -> None:
    bounds = _lower_bounds()
    pins = _pins()
    # the linters are pinned to a minor series on purpose (newest of it in both runs)
    bounds = {k: v for k, v in bounds.items() if k not in {"mypy", "ruff"}}
    same = {k for k in bounds.keys() & pins.keys() if Version(bounds[k]) == Version(pins[k])}
    assert same == bounds.keys() == pins.keys(), (
        "pyproject.toml's lower bounds and .ci/oldest.txt differ: "
        f"only in pyproject {sorted(set(bounds.items()) - set(pins.items()))}, "
        f"only in .ci/oldest.txt {sorted(set(pins.items()) - set(bounds.items()))}"
    )


def test_a_floor_is_a_version_the_ranges_allow() -> None:
    """Each pin satisfies every specifier of its requirement (an upper bound below a floor is a typo)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(text)
        if req.name.lower() in pins:
            assert req.specifier.contains(pins[req.name.lower()]), f"{req}: {pins[req.name.lower()]} not allowed"
