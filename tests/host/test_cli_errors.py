"""Bad input gets one `error:` line (and maybe a hint) and a non-zero exit code, never a traceback."""

import socket
from pathlib import Path

from tests.agent.bundles import make_bundle
from tests.helpers import Cli, assert_one_line_error


def test_missing_and_corrupt_model(cli: Cli, tmp_path: Path) -> None:
    assert_one_line_error(cli("build", str(tmp_path / "nope.onnx"), "--profile", "cpu-x86_64"), 2, "does not exist")
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    assert_one_line_error(cli("build", str(bad), "--profile", "cpu-x86_64"), 2, "not a valid ONNX model")


def test_unknown_profile_and_device(cli: Cli, tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_text("x")
    assert_one_line_error(cli("build", str(model), "--profile", "jetson-tx1"), 2, "unknown profile 'jetson-tx1'")
    assert_one_line_error(cli("profiles", "show", "nano"), 2, "unknown profile")
    assert_one_line_error(cli("push", "ghost", str(make_bundle(tmp_path))), 2, "unknown device 'ghost'")


def test_malformed_inventory(cli: Cli, tmp_path: Path) -> None:
    inv = tmp_path / "devices.toml"
    inv.write_text("[devices.a\nhost=")
    assert_one_line_error(cli("devices", "list", "--inventory", str(inv)), 2, "not valid TOML")


def test_corrupt_and_missing_bundle(cli: Cli, tmp_path: Path) -> None:
    junk = tmp_path / "junk.edb"
    junk.write_bytes(b"\x1f\x8b\x08junk")
    assert_one_line_error(cli("inspect", str(junk)), 2, "junk.edb")
    assert_one_line_error(cli("inspect", str(tmp_path / "none.edb")), 2, "no such bundle")


def test_unreachable_and_unenrolled_host(cli: Cli, tmp_path: Path) -> None:
    inv = tmp_path / "devices.toml"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli(
        "devices",
        "add",
        "dead",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--profile",
        "cpu-x86_64",
        "--inventory",
        str(inv),
    )
    assert r.code == 0, r.err
    bundle = make_bundle(tmp_path / "b")
    assert_one_line_error(cli("push", "dead", str(bundle), "--inventory", str(inv)), 3, "unreachable")
    assert_one_line_error(cli("devices", "enroll", "dead", "--yes", "--inventory", str(inv)), 3, "cannot reach")
