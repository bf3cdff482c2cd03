"""docs/troubleshooting.md covers every error code the code can return, and the hints link to real sections."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import edgedeploy
import edgedeploy_agent
from edgedeploy.errors import (
    ConnectionFailed,
    DeviceError,
    EdgeDeployError,
    HostKeyError,
    InputError,
    error_code,
    hint_with_link,
)
from edgedeploy_agent.errors import AgentError

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "troubleshooting.md"
# the error codes written as literals: DeviceError(..., code="x") on the host, {"code": "x"} in the agent
_LITERAL = re.compile(r"""(?:\bcode\s*=\s*|["']code["']\s*:\s*)["']([a-z][a-z0-9-]+)["']""")


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def _import_all(package: object) -> None:
    """Import every module of a package, so every error class is defined (the TensorRT and metrics ones too)."""
    for mod in pkgutil.walk_packages(package.__path__, package.__name__ + "."):  # type: ignore[attr-defined]
        if mod.name.endswith("__main__"):  # running it would start the program
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:  # an optional backend (TensorRT, torch): its errors are found by the literal scan
            continue


def _defined_codes() -> set[str]:
    _import_all(edgedeploy_agent)
    _import_all(edgedeploy)
    codes = {c.code for c in {AgentError, *_subclasses(AgentError)}}
    codes |= {c.__name__ for c in {EdgeDeployError, *_subclasses(EdgeDeployError)}}
    codes |= {"host-key", DeviceError("x").code}
    for root in (REPO / "host", REPO / "agent"):
        for path in root.rglob("*.py"):
            codes |= set(_LITERAL.findall(path.read_text(encoding="utf-8")))
    return codes


def _anchors() -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than '-' dropped, spaces become '-'."""
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*$", DOC.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_error_code_in_the_code_has_a_section() -> None:
    codes = _defined_codes()
    # the scan finds what it should: agent codes, host device codes, JSON-only codes, host class names
    assert {"bad-bundle", "engine-rejected", "metrics-unavailable", "agent-missing", "not-initialised"} <= codes
    assert {"os-error", "no-bundle", "load-failed", "BuildError", "host-key"} <= codes
    missing = sorted(c for c in codes if c.lower() not in _anchors())
    assert not missing, f"docs/troubleshooting.md has no section for: {', '.join(missing)}"


def test_every_exit_code_has_one_row_in_the_table_and_the_readme() -> None:
    """Each EXIT_* constant is a row of troubleshooting.md's exit code table and is named in the README;
    no two constants share a number (one meaning each)."""
    import edgedeploy.errors as errors

    values = [v for k, v in vars(errors).items() if k.startswith("EXIT_")]
    assert len(values) == len(set(values)) >= 8
    section = DOC.read_text(encoding="utf-8").split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)}
    assert rows == set(values)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert all(re.search(rf"\b{v} ", readme) for v in values if v), readme
    assert EdgeDeployError.exit_code == errors.EXIT_FAILED and InputError.exit_code == errors.EXIT_INPUT


def test_the_gpu_classics_are_there() -> None:
    text = DOC.read_text(encoding="utf-8")
    for phrase in ("no kernel image is available for execution on the device", "driver too old", "another TensorRT"):
        assert phrase in text


@pytest.mark.parametrize(
    "error",
    [
        DeviceError("bundle holds sm_75 code", hint="build for the device's profile", code="incompatible-bundle"),
        DeviceError("agent gave no result"),
        HostKeyError("changed"),
        ConnectionFailed("timed out"),
    ],
)
def test_device_and_connection_hints_link_to_an_existing_section(error: EdgeDeployError) -> None:
    hint = hint_with_link(error)
    assert hint is not None
    link = re.search(r"docs/troubleshooting\.md#([a-z0-9-]+)", hint)
    assert link is not None and link.group(1) in _anchors(), hint
    assert link.group(1) == error_code(error).lower()
    if error.hint:
        assert hint.startswith(error.hint)


def test_other_hints_are_unchanged() -> None:
    assert hint_with_link(InputError("bad", hint="fix it")) == "fix it"
