"""Small helpers shared by tests (not fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


@dataclass
class Ran:
    code: int
    out: str
    err: str


class Cli:
    def __call__(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Ran:
        p = subprocess.run(
            [str(BIN / "edgedeploy"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            stdin=subprocess.DEVNULL,
        )
        return Ran(p.returncode, p.stdout, p.stderr)


def agent(*args: str, timeout: float = 120) -> Ran:
    p = subprocess.run(
        [str(BIN / "edgedeploy-agent"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Ran(p.returncode, p.stdout, p.stderr)


def assert_one_line_error(r: Ran, code: int | None = None, contains: str = "") -> None:
    """A failed command prints `error: ...` (and maybe `hint: ...`), never a traceback."""
    assert r.code != 0, r
    if code is not None:
        assert r.code == code, r
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip() and not ln.startswith("hint:")]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, r.err
    assert contains.lower() in errors[0].lower(), r.err
