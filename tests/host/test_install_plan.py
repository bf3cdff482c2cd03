"""The install planner is pure: facts in, steps out."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from edgedeploy.errors import DeviceError
from edgedeploy.remote.install import InstallFiles, InstallSpec, parse_install_probe, plan_install


def _wheel(tmp_path: Path) -> Path:
    w = tmp_path / "edgedeploy-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("edgedeploy_agent/__init__.py", "__version__ = '0.1.0'\n")
    return w


def _spec(tmp_path: Path, mode: str = "systemd") -> InstallSpec:
    lib = tmp_path / "libtvm_runtime.so"
    lib.write_bytes(b"lib")
    return InstallSpec(
        "python3.9", "/opt/edgedeploy/venv", "/var/lib/edgedeploy", mode, "edgedeploy", (_wheel(tmp_path),), lib
    )


FRESH_JETSON = "uid=1000\narch=aarch64\npython=3.9\nsystemctl=1\njetson=# R35 (release), REVISION: 4.1\n"


def test_fresh_jetson_gets_everything_but_no_restart_without_a_release(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    unit = tmp_path / "u.service"
    unit.write_text(spec.unit_text())
    facts = parse_install_probe(FRESH_JETSON)
    assert facts.jetson and facts.uid == 1000 and facts.python == "3.9"
    steps = plan_install(facts, spec, InstallFiles(unit))
    names = [s.name for s in steps]
    assert names[0] == "create user" and "create venv" in names and "install unit" in names
    assert "hand the root to the service user" in names and "restart agent" not in names
    assert all(s.root for s in steps)  # systemd mode: every step runs as root (sudo -n for a non-root login)
    assert "ExecStart=/opt/edgedeploy/venv/bin/edgedeploy-agent --root /var/lib/edgedeploy run" in spec.unit_text()


def test_installed_device_plans_nothing(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    unit = tmp_path / "u.service"
    unit.write_text(spec.unit_text())
    done = FRESH_JETSON + (
        f"user_exists=1\nvenv=1\nstamp={spec.stamp}\ninitialised=1\nhas_release=1\n"
        f"unit_sha256={hashlib.sha256(unit.read_bytes()).hexdigest()}\n"
        f"runtime_sha256={hashlib.sha256(b'lib').hexdigest()}\n"
    )
    assert plan_install(parse_install_probe(done), spec, InstallFiles(unit)) == []
    # a changed unit alone: install it, reload, enable, and restart the agent that has a release
    changed = done.replace("unit_sha256=", "unit_sha256=0")
    names = [s.name for s in plan_install(parse_install_probe(changed), spec, InstallFiles(unit))]
    assert names == ["install unit", "reload systemd", "enable unit", "restart agent"]


def test_missing_python_and_missing_systemd_are_clear_errors(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    with pytest.raises(DeviceError, match="python3.9 not found") as e:
        plan_install(parse_install_probe("uid=0\narch=aarch64\nsystemctl=1\n"), spec)
    assert "python3.9-venv" in (e.value.hint or "")
    with pytest.raises(DeviceError, match="no systemctl"):
        plan_install(parse_install_probe("uid=0\narch=x86_64\npython=3.11\n"), spec)
    process = dataclasses.replace(spec, mode="process")
    steps = plan_install(parse_install_probe("uid=0\narch=x86_64\npython=3.11\n"), process)
    assert not any(s.root for s in steps) and "create user" not in [s.name for s in steps]


def test_a_non_root_login_gets_the_group_and_a_sudoers_rule_for_this_unit_only(tmp_path: Path) -> None:
    from edgedeploy.remote.install import write_install_files

    spec = dataclasses.replace(_spec(tmp_path), login_user="deploy")
    work = tmp_path / "work"
    work.mkdir()
    unit, sudoers = write_install_files(spec, work)
    assert unit is not None and sudoers is not None
    rule = sudoers.read_text()
    assert rule.count("NOPASSWD") == 1 and rule.startswith("# installed") and "deploy ALL=(root) NOPASSWD:" in rule
    assert "/usr/bin/systemctl restart edgedeploy-agent.service" in rule and "ALL\n" not in rule.split("NOPASSWD:")[1]
    assert "/usr/bin/systemctl reset-failed edgedeploy-agent.service" in rule  # deploys do not spend the start limit
    names = [s.name for s in plan_install(parse_install_probe(FRESH_JETSON), spec, InstallFiles(unit, sudoers))]
    i = names.index("upload sudoers rule")
    assert names[i : i + 3] == ["upload sudoers rule", "check sudoers rule", "install sudoers rule"]
    assert "add the login to the service group" in names
    done = FRESH_JETSON + (
        f"user_exists=1\nvenv=1\nstamp={spec.stamp}\ninitialised=1\nlogin_in_group=1\n"
        f"unit_sha256={hashlib.sha256(unit.read_bytes()).hexdigest()}\n"
        f"runtime_sha256={hashlib.sha256(b'lib').hexdigest()}\n"
        f"sudoers_sha256={hashlib.sha256(sudoers.read_bytes()).hexdigest()}\n"
    )
    assert plan_install(parse_install_probe(done), spec, InstallFiles(unit, sudoers)) == []


def test_a_root_with_spaces_is_quoted_and_unsafe_values_are_refused(tmp_path: Path) -> None:
    from edgedeploy.errors import InputError
    from edgedeploy.remote.install import write_install_files

    spec = dataclasses.replace(_spec(tmp_path), root="/srv/edge deploy", login_user="deploy")
    unit = spec.unit_text()
    assert 'ExecStart=/opt/edgedeploy/venv/bin/edgedeploy-agent --root "/srv/edge deploy" run' in unit
    assert 'ReadWritePaths="/srv/edge deploy"' in unit
    for bad in (
        dataclasses.replace(spec, venv="/opt/v\nExecStartPre=/bin/sh"),  # would be a second unit line
        dataclasses.replace(spec, root='/srv/"x"'),
    ):
        with pytest.raises(InputError, match="cannot write the systemd unit"):
            write_install_files(bad, tmp_path)
    for login in ("deploy\nALL ALL=(ALL) NOPASSWD: ALL", "a,b", "ops team", "-x", "#0"):
        with pytest.raises(InputError, match="sudoers rule"):
            dataclasses.replace(spec, login_user=login).sudoers_text()


def test_the_runtime_and_the_cuda_backend_share_one_lib_dir_and_each_goes_only_when_changed(tmp_path: Path) -> None:
    backend = tmp_path / "libedgedeploy_cuda.so"
    backend.write_bytes(b"backend")
    spec = dataclasses.replace(_spec(tmp_path, mode="process"), cuda_backend_lib=backend)
    assert parse_install_probe(FRESH_JETSON).nvidia and parse_install_probe("cuda_driver=1\n").nvidia
    assert not parse_install_probe("uid=0\narch=x86_64\n").nvidia  # no driver, not a Jetson: no backend wanted
    steps = plan_install(parse_install_probe(FRESH_JETSON), spec)
    names = [s.name for s in steps]
    assert names.count("make lib dir") == 1
    assert names.index("make lib dir") < names.index("upload TVM runtime") < names.index("upload CUDA backend")
    assert {s.put[1] for s in steps if s.put and s.name.startswith("upload ") and "lib" in s.put[1]} == {
        "/var/lib/edgedeploy/lib/libtvm_runtime.so",
        "/var/lib/edgedeploy/lib/libedgedeploy_cuda.so",
    }
    init = next(s.argv for s in steps if s.name == "initialise agent root")
    assert init[-2:] == ("--cuda-backend-lib", "/var/lib/edgedeploy/lib/libedgedeploy_cuda.so")
    # the runtime already there, the backend changed: its upload alone, and init records it
    have_runtime = FRESH_JETSON + f"initialised=1\nruntime_sha256={hashlib.sha256(b'lib').hexdigest()}\n"
    names = [s.name for s in plan_install(parse_install_probe(have_runtime), spec)]
    assert "upload TVM runtime" not in names and "upload CUDA backend" in names and "initialise agent root" in names
    both = have_runtime + f"cuda_backend_sha256={hashlib.sha256(b'backend').hexdigest()}\n"
    names = [s.name for s in plan_install(parse_install_probe(both), spec)]
    assert not {"make lib dir", "upload TVM runtime", "upload CUDA backend", "initialise agent root"} & set(names)
