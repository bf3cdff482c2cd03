"""Signing from the command line: keys, enrolment pins them, the device refuses what is not signed right."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from tests.helpers import Cli, assert_one_line_error
from tests.integration.conftest import Enrolled

pytestmark = pytest.mark.integration


def test_keys_sign_enroll_push(cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path) -> None:
    r = cli("keys", "generate", "fleet-1", "--json")
    assert r.code == 0, r.err
    kid = json.loads(r.out)["key_id"]
    r = cli("devices", "enroll", device.name, "--yes", "--json", *device.args())
    assert r.code == 0 and json.loads(r.out)["trusted_keys"] == [kid], r.out + r.err

    assert cli("keys", "generate", "fleet-2").code == 0  # the next key, for rotation
    listed = json.loads(cli("keys", "list", "--json").out)
    assert [k["name"] for k in listed] == ["fleet-1", "fleet-2"] and all(k["has_private"] for k in listed)
    r = cli("keys", "install", device.name, "--json", *device.args())
    assert r.code == 0, r.err
    assert sorted(json.loads(r.out)["succeeded"][device.name]) == sorted(k["key_id"] for k in listed)
    assert_one_line_error(cli("push", device.name, str(mnist_bundle), *device.args()), 4, "is not signed")

    signed = tmp_path / "signed.edb"
    r = cli("sign", str(mnist_bundle), "--key", "fleet-1", "-o", str(signed), "--json")
    assert r.code == 0, r.err
    serial = json.loads(r.out)["serial"]
    r = cli("push", device.name, str(signed), "--json", *device.args())
    assert r.code == 0 and json.loads(r.out)["outcome"] == "committed", r.err

    old = tmp_path / "old.edb"
    assert cli("sign", str(mnist_bundle), "--key", "fleet-2", "-o", str(old), "--serial", str(serial - 1)).code == 0
    assert_one_line_error(cli("push", device.name, str(old), *device.args()), 4, "already ran serial")
    expired = tmp_path / "expired.edb"
    sign = ("sign", str(mnist_bundle), "--key", "fleet-2", "-o", str(expired))
    assert_one_line_error(cli(*sign, "--expires-days", "-1"), 2, "--expires-days must be greater than 0")
    assert cli(*sign, "--expires-days", "0.00001").code == 0  # valid for 0.9 s
    time.sleep(1.5)
    assert_one_line_error(cli("push", device.name, str(expired), *device.args()), 4, "expired")
    assert (device.root / "models" / "default" / "current").resolve().name == read_manifest(signed).release_name
