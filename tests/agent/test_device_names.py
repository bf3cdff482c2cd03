"""The agent refuses device names the host refuses (issue 40 #9): `init` says so in one line, and a name
written into agent.json by hand stops `watch` at start (it could never report), never its MQTT thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import agent


@pytest.mark.parametrize("name", ["+", "#", "a/b", "x" * 300, "x" * 70000])
def test_init_refuses_a_name_the_host_refuses(tmp_path: Path, name: str) -> None:
    root = str(tmp_path / "root")
    r = agent("--root", root, "init", "--device-name", name)
    assert r.code == 9 and "not a device name" in r.out + r.err and "Traceback" not in r.out + r.err, r
    assert len((r.out + r.err).strip().splitlines()) <= 2  # error + hint, the name cut short
    assert not (tmp_path / "root" / "agent.json").exists()


def test_a_stored_bad_name_stops_watch_in_one_line_and_init_repairs_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert agent("--root", str(root), "init", "--device-name", "cam-01").code == 0
    cfg = json.loads((root / "agent.json").read_text())
    cfg["device_name"] = "cam/01"  # written by an older agent, or by hand
    (root / "agent.json").write_text(json.dumps(cfg))
    (root / "watch.json").write_text(json.dumps({"broker": "127.0.0.1:9", "registry_url": "http://127.0.0.1:9"}))
    r = agent("--root", str(root), "watch", "--max-seconds", "1")
    assert r.code == 9 and "not a device name" in r.err and "Traceback" not in r.err, r
    r = agent("--root", str(root), "facts")
    assert r.code == 9 and "Traceback" not in r.out + r.err, r
    assert agent("--root", str(root), "init", "--device-name", "cam-02").code == 0
    assert json.loads((root / "agent.json").read_text())["device_name"] == "cam-02"
