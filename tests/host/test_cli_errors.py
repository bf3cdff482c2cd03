"""Bad input gets one `error:` line (and maybe a hint) and a non-zero exit code, never a traceback."""

import json
import socket
from pathlib import Path

import pytest

from edgedeploy.inventory import Device, Inventory
from edgedeploy_agent.bundle import SIGNATURE_NAME, read_manifest, write_bundle
from tests.agent.bundles import make_bundle, rewrite_bundle
from tests.helpers import Cli, agent, assert_one_line_error


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


def _dead_device(inv: Path) -> None:
    """A device at a port nobody listens on: anything that got past validation would fail with exit 3."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    Inventory.load(inv).add(Device(name="dead", host="127.0.0.1", port=port, profile="cpu-x86_64"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["push", "dead", "BUNDLE", "--timeout", "-5"], "--timeout must be greater than 0, got -5"),
        (["push", "dead", "BUNDLE", "--io-timeout", "0"], "--io-timeout must be greater than 0"),
        (["push", "dead", "BUNDLE", "--min-inferences", "-1"], "--min-inferences must be at least 0"),
        (["push", "dead", "BUNDLE", "--connect-timeout", "nan"], "--connect-timeout must be greater than 0, got nan"),
        (["push", "dead", "BUNDLE", "--min-fps", "inf"], "--min-fps must be greater than 0, got inf"),
        (["push", "dead", "BUNDLE", "--prebuild", "--build-timeout", "0"], "--build-timeout"),
        (["rollback", "dead", "--timeout", "0"], "--timeout must be greater than 0"),
        (["rollout", "BUNDLE", "--devices", "dead", "--max-p95-ms", "-1"], "--max-p95-ms must be greater than 0"),
        (["rollout", "BUNDLE", "--devices", "dead", "--concurrency", "0"], "--concurrency must be at least 1"),
        (["sign", "BUNDLE", "--key", "k", "--expires-days", "-1"], "--expires-days must be greater than 0"),
        (["tune", "BUNDLE", "--trials", "0"], "--trials must be at least 1"),
        (["eval", "BUNDLE", "--data", ".", "--limit", "0"], "--limit must be at least 1"),
    ],
)
def test_numbers_out_of_range_are_refused_before_anything_moves(
    cli: Cli, tmp_path: Path, args: list[str], message: str
) -> None:
    inv = tmp_path / "devices.toml"
    _dead_device(inv)
    bundle = make_bundle(tmp_path / "b")
    before = bundle.read_bytes()
    r = cli(*[str(bundle) if a == "BUNDLE" else a for a in args], env={"EDGEDEPLOY_INVENTORY": str(inv)})
    assert_one_line_error(r, 2, message)
    assert "hint: see edgedeploy" in r.err
    assert bundle.read_bytes() == before  # not signed, not touched


def test_preprocessing_that_does_not_fit_the_model_is_refused_before_writing(
    cli: Cli, tmp_path: Path, data_dir: Path
) -> None:
    mnist = str(data_dir / "models" / "mnist-8_opset13.onnx")  # one gray channel
    mobilenet = str(data_dir / "models" / "mobilenet_v1_0.25_224.onnx")  # three channels
    out = tmp_path / "out" / "m.edb"
    for args, message in [
        ([mnist, "--mean", "127.5,127.5,127.5"], "mean has 3 values, but input Input3 of mnist-8_opset13.onnx has 1"),
        ([mnist, "--mean", "1,2,3", "--std", "1"], "mean has 3 values, but input Input3"),  # issue 18's command
        ([mobilenet, "--std", "1,2"], "std has 2 values, but input input of mobilenet_v1_0.25_224.onnx has 3"),
        ([mobilenet, "--color", "gray"], "color gray gives 1 channel, but input input"),
        ([mnist, "--std", "0"], "must not be 0"),
        ([mnist, "--scale", "nan"], "must be finite"),
        ([mnist, "--mean", "1,x"], "--mean takes comma-separated numbers"),
        ([mnist, "--crop-fraction", "1.5"], "--crop-fraction must be between 0 and 1"),
    ]:
        r = cli("build", *args, "--profile", "cpu-x86_64", "-o", str(out))
        assert_one_line_error(r, 2, message)
        assert "compile" not in r.err and not out.parent.exists()  # refused before compiling or writing


def test_bad_output_path_name_and_unreadable_card_are_one_line(cli: Cli, tmp_path: Path, data_dir: Path) -> None:
    mnist = str(data_dir / "models" / "mnist-8_opset13.onnx")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    latin1 = tmp_path / "card.toml"
    latin1.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    out = ["-o", str(tmp_path / "out" / "m.edb")]
    for args, message in [
        (["-o", str(folder)], f"-o {folder} is a folder"),
        (["-o", str(a_file / "m.edb")], f"{a_file} is a file, not a folder"),
        (["--name", "two words", *out], "name: String should match pattern"),
        (["--version", "1\n2", *out], "version: String should match pattern"),
        (["--card", str(latin1), *out], "is not UTF-8 text"),
        (["--card", str(folder), *out], f"cannot read model card {folder}: {folder} is a folder"),
        (["--labels", str(latin1), *out], "labels file"),
    ]:
        r = cli("build", mnist, "--profile", "cpu-x86_64", *args)
        assert_one_line_error(r, 2, message)
        assert "compile" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "card.toml", "folder"]  # no out/, no logs
    assert not list(folder.iterdir()) and a_file.read_text() == "x"
    bundle = make_bundle(tmp_path / "b")
    assert_one_line_error(cli("sign", str(bundle), "--key", "k", "-o", str(folder)), 2, f"-o {folder} is a folder")
    assert not list(folder.iterdir())


def test_inventory_and_config_files_a_user_can_break(cli: Cli, tmp_path: Path, hermetic: Path) -> None:
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b"[devices.caf\xe9]\n")
    assert_one_line_error(cli("devices", "list", "--inventory", str(latin1)), 2, "is not UTF-8 text")
    add = ["devices", "add", "cam", "--host", "10.0.0.9", "--profile", "cpu-x86_64"]
    config_file = tmp_path / "config-file"
    config_file.write_text("x")
    r = cli(*add, env={"EDGEDEPLOY_CONFIG_DIR": str(config_file)})
    assert_one_line_error(r, 2, f"{config_file} is not a folder")
    proc = "/proc/edgedeploy.toml"  # nothing can be created in /proc, not even by root
    assert_one_line_error(cli(*add, "--inventory", proc), 2, f"cannot write inventory {proc}")
    inv = tmp_path / "devices.toml"
    r = cli(*add, "--root", "/var/lib/x\nExecStartPre=/bin/sh", "--inventory", str(inv))
    assert_one_line_error(r, 2, "root: Value error, '/var/lib/x\\nExecStartPre=/bin/sh' holds a control character")
    assert not inv.exists() and config_file.read_text() == "x"


def test_devices_add_says_what_process_mode_does_not_do(cli: Cli, tmp_path: Path, hermetic: Path) -> None:
    add = ["devices", "add", "cam", "--host", "10.0.0.9", "--profile", "cpu-x86_64"]
    inv = ["--inventory", str(tmp_path / "devices.toml")]
    r = cli(*add, "--service", "process", *inv)
    assert r.code == 0 and "nothing restarts an agent that dies" in r.err and "--service systemd" in r.err, r.err
    r = cli(*add, "--service", "systemd", "--replace", *inv)
    assert r.code == 0 and "note:" not in r.err, r.err


def test_a_bundle_with_two_signatures_is_refused_by_host_and_device(cli: Cli, tmp_path: Path) -> None:
    src = make_bundle(tmp_path / "src")
    files = {"labels.txt": tmp_path / "src" / "labels.txt", "model.so": tmp_path / "src" / "model-1.so"}
    signed = write_bundle(tmp_path / "signed.edb", read_manifest(src), files, signature=b"{}")
    twice = rewrite_bundle(signed, tmp_path / "twice.edb", lambda n, d: (n, d), repeat=SIGNATURE_NAME)
    inv = tmp_path / "devices.toml"
    _dead_device(inv)
    r = cli("push", "dead", str(twice), "--inventory", str(inv))
    assert_one_line_error(r, 2, "manifest.sig must appear once, right after manifest.json")

    root = tmp_path / "device"
    assert agent("--root", str(root), "--json", "init").code == 0
    r = agent("--root", str(root), "--json", "deploy", str(twice))
    assert r.code != 0 and json.loads(r.out)["error"]["code"] == "bad-bundle", r.out
    assert (
        not list((root / "models" / "default" / "releases").iterdir())
        and not (root / "models" / "default" / "current").exists()
    )


def test_version_names_the_host_agent_and_bundle_schema(cli: Cli) -> None:
    import edgedeploy
    from edgedeploy_agent.bundle import SCHEMA_VERSION

    r = cli("--version")
    assert (
        r.code == 0
        and r.out.strip() == f"edgedeploy {edgedeploy.__version__} (agent 0.1.0, bundle schema {SCHEMA_VERSION})"
    )


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["--precision", "int4"], "--precision 'int4' is not a precision", "choose fp32 (the default), fp16"),
        (["--precision", "INT8"], "--int8 (or --precision int8) needs --calibration", None),
        (["--precision", "fp16"], "--precision fp16 is for GPU profiles; cpu-x86_64 is a cpu profile", "CUDA profile"),
        (["--precision", "FP16", "--int8", "--calibration", "."], "--int8 builds int8, --precision fp16", "give one"),
        (["--batch", "0"], "--batch must be at least 1, got 0", "see edgedeploy build --help"),
        (["--batch", "two"], "--batch takes a whole number", None),
        (["--batch", "1:8:32"], "--batch for TVM is one static batch size", "for --runtime tensorrt"),
        (["--runtime", "TensorRT", "--int8", "--calibration", "."], "--runtime tensorrt needs a CUDA profile", None),
        (["--int8", "--calibration", "no-such-folder"], "--calibration no-such-folder does not exist", None),
        (["--color", "GREY"], "color: Input should be 'rgb', 'bgr' or 'gray'", "see edgedeploy build --help"),
    ],
)
def test_build_options_are_refused_before_the_model_is_read(
    cli: Cli, tmp_path: Path, args: list[str], message: str, hint: str | None
) -> None:
    """Issue 35: int4 compiled for 9 s and exited 70, INT8 said "need --int8", fp16 on a CPU profile exited 1,
    --batch 0 gave a TensorRT hint. The model here is not even ONNX: any check after reading it would say so."""
    junk = tmp_path / "junk.onnx"
    junk.write_text("not a model")
    r = cli("build", str(junk), "--profile", "cpu-x86_64", "-o", str(tmp_path / "out" / "j.edb"), *args)
    assert_one_line_error(r, 2, message)
    hints = [ln for ln in r.err.splitlines() if ln.startswith("hint:")]
    assert (hint is None and not hints) or (hint is not None and hint in hints[0]), r.err
    if "--runtime" not in args:
        assert "tensorrt" not in r.err.lower() or "1:8:32" in args, r.err
    assert not (tmp_path / "out").exists()


def test_precision_names_are_case_insensitive(data_dir: Path) -> None:
    from edgedeploy.compile.build_options import check_options
    from edgedeploy.profiles import get_profile

    model = data_dir / "models" / "mnist-8_opset13.onnx"
    cpu, t4 = get_profile("cpu-x86_64"), get_profile("t4")
    assert check_options(model, cpu, "TVM", "INT8", None, False) == ("tvm", "int8", 1)
    assert check_options(model, cpu, "tvm", " Fp32 ", "4", False) == ("tvm", "fp32", 4)
    assert check_options(model, t4, "tvm", "FP16", 8, False) == ("tvm", "fp16", 8)
    assert check_options(model, t4, "tensorrt", "fp32", "1:8:32", True) == ("tensorrt", "int8", (1, 8, 32))
