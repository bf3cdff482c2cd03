"""The install planner is pure: facts in, steps out."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from edgedeploy.errors import DeviceError, InputError
from edgedeploy.remote.install import InstallFiles, InstallSpec, parse_install_probe, plan_install
from tests.helpers import require, system_python


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
    unit, sudoers, helpers, _ = write_install_files(spec, work)
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
    done += "".join(f"unit_sha256:{n}={hashlib.sha256(f.read_bytes()).hexdigest()}\n" for n, f in helpers.items())
    assert plan_install(parse_install_probe(done), spec, InstallFiles(unit, sudoers, helpers)) == []


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


JETPACK_SYSTEM = "system_python=3.8.10\nsystem_tensorrt=8.5.2.2\nsystem_opencv=4.5.4\nsystem_gstreamer=1\n"


def test_a_jetson_gets_a_sidecar_venv_of_its_system_python_with_polygraphy(tmp_path: Path) -> None:
    from edgedeploy.remote.install import InstallOptions
    from edgedeploy.remote.install_run import choose_sidecar

    spec = dataclasses.replace(_spec(tmp_path), system_python="/usr/bin/python3.8")
    facts = parse_install_probe(FRESH_JETSON + JETPACK_SYSTEM)
    assert facts.system_tensorrt == "8.5.2.2" and facts.system_gstreamer and not facts.sidecar_venv
    spec, note = choose_sidecar(facts, spec, InstallOptions())
    assert spec.sidecar and "TensorRT 8.5.2.2, OpenCV 4.5.4 with GStreamer" in note and "venv-system" in note
    steps = {s.name: s for s in plan_install(facts, spec)}
    venv = steps["create system-Python venv"].argv
    assert venv == ("/usr/bin/python3.8", "-m", "venv", "--system-site-packages", "/opt/edgedeploy/venv-system")
    assert steps["install polygraphy"].argv[0] == "/opt/edgedeploy/venv-system/bin/python"
    assert steps["install polygraphy"].argv[-3:] == ("--find-links", "/opt/edgedeploy/venv/wheels", "polygraphy")
    init = steps["initialise agent root"].argv
    assert init[init.index("--system-python") + 1] == "/opt/edgedeploy/venv-system/bin/python"
    names = list(steps)
    assert names.index("install agent") < names.index("install polygraphy") < names.index("initialise agent root")

    # a second run: the venv and polygraphy are there, the root initialised: nothing for the sidecar
    done = FRESH_JETSON + JETPACK_SYSTEM + "sidecar_venv=1\nsidecar_polygraphy=1\ninitialised=1\n"
    done += f"runtime_sha256={hashlib.sha256(b'lib').hexdigest()}\n"
    again = [s.name for s in plan_install(parse_install_probe(done), spec)]
    assert not {"create system-Python venv", "install polygraphy", "initialise agent root"} & set(again)


def test_the_system_python_is_used_only_where_it_helps_and_a_given_one_must_run(tmp_path: Path) -> None:
    from edgedeploy.remote.install import InstallOptions
    from edgedeploy.remote.install_run import choose_sidecar

    spec = dataclasses.replace(_spec(tmp_path), system_python="/usr/bin/python3.8")
    x86 = parse_install_probe("uid=0\narch=x86_64\npython=3.11\nsystemctl=1\nsystem_python=3.8.10\n")
    unused, note = choose_sidecar(x86, spec, InstallOptions())
    assert not unused.sidecar and unused.system_python is None and "not used" in note
    assert "create system-Python venv" not in [s.name for s in plan_install(x86, unused)]
    absent = parse_install_probe(FRESH_JETSON)
    assert not choose_sidecar(absent, spec, InstallOptions())[0].sidecar
    with pytest.raises(DeviceError, match="--system-python /usr/bin/python3.8 does not run on the device"):
        choose_sidecar(absent, spec, InstallOptions(system_python="/usr/bin/python3.8"))
    # offline, TensorRT on the device, no polygraphy wheel in the wheelhouse: refused before anything changes
    jetson = parse_install_probe(FRESH_JETSON + JETPACK_SYSTEM)
    with pytest.raises(InputError, match="no polygraphy wheel"):
        choose_sidecar(jetson, dataclasses.replace(spec, offline=True), InstallOptions(offline=True))


def test_the_probe_reads_a_real_system_pythons_opencv_and_tensorrt(tmp_path: Path) -> None:
    """The probe's system-Python lines, run by sh against this machine's /usr/bin/python3 (Debian's OpenCV with
    GStreamer, no TensorRT) and an absent one."""
    import subprocess

    from edgedeploy.remote.install import PROBE

    py = system_python()
    require("GSTREAMER", None if py else "no /usr/bin/python3 (Debian's python3, which python3-opencv brings)")
    assert py is not None
    args = ["python3", str(tmp_path / "venv"), str(tmp_path), "nobody", "/nonexistent.service", "stamp", "root", "x"]
    out = subprocess.run(["sh", "-c", PROBE, "sh", *args, py, str(tmp_path / "venv-system")], capture_output=True)
    facts = parse_install_probe(out.stdout.decode())
    assert facts.system_python is not None and facts.system_python.startswith("3.")
    has_cv2 = subprocess.run([py, "-c", "import cv2"], capture_output=True).returncode == 0
    assert (facts.system_opencv is not None) == has_cv2 and facts.system_tensorrt is None
    none = subprocess.run(["sh", "-c", PROBE, "sh", *args, "/nonexistent/python3.8", ""], capture_output=True)
    assert parse_install_probe(none.stdout.decode()).system_python is None


def test_every_systemd_install_gets_restarts_without_sudo_and_the_finisher(tmp_path: Path) -> None:
    """The restart path unit with its root oneshot, and the finish oneshot with its timer (a deploy cut off with
    its host is finished on the device, docs/agent-service.md); a second run plans nothing."""
    from edgedeploy.remote.install import write_install_files
    from edgedeploy_agent.unit import FINISH_TIMER, FINISH_UNIT, RESTART_PATH_UNIT, RESTART_UNIT

    spec = _spec(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    files = write_install_files(spec, work)
    names = [s.name for s in plan_install(parse_install_probe(FRESH_JETSON), spec, files)]
    tail = names[names.index(f"install {RESTART_UNIT}") :]
    assert tail == [
        f"install {RESTART_UNIT}", f"install {FINISH_UNIT}", "reload systemd",
        f"install {RESTART_PATH_UNIT}", "reload systemd", f"enable {RESTART_PATH_UNIT}",
        f"install {FINISH_TIMER}", "reload systemd", f"enable {FINISH_TIMER}",
        f"start {RESTART_PATH_UNIT} and {FINISH_TIMER}",
    ]  # fmt: skip
    finish = files.helpers[FINISH_UNIT].read_text()
    assert (
        "ExecStart=/opt/edgedeploy/venv/bin/edgedeploy-agent --root /var/lib/edgedeploy --json recover --finish"
        in finish
    )
    assert "User=edgedeploy" in finish and "ReadWritePaths=/var/lib/edgedeploy" in finish
    assert "PathChanged=/var/lib/edgedeploy/run/restart-request" in files.helpers[RESTART_PATH_UNIT].read_text()
    have = "".join(f"unit_sha256:{n}={hashlib.sha256(f.read_bytes()).hexdigest()}\n" for n, f in files.helpers.items())
    again = [s.name for s in plan_install(parse_install_probe(FRESH_JETSON + have), spec, files)]
    assert not [n for n in again if "edgedeploy-agent-restart" in n or "edgedeploy-agent-finish" in n]

    # a root a path unit cannot watch: no helpers (the next deploy recovers a cut-off transition, as before)
    spaced = dataclasses.replace(spec, root="/srv/edge deploy")
    (tmp_path / "w2").mkdir()
    assert write_install_files(spaced, tmp_path / "w2").helpers == {}


def test_each_model_slot_gets_its_unit_from_the_template_with_its_restart_path_and_sudoers_lines(
    tmp_path: Path,
) -> None:
    """The inventory's model slots besides default: the templates installed once, per slot its unit enabled (its
    first push starts it) and its restart path unit started; the login may restart exactly these units. A second
    run plans nothing; a slot added later gets only its own steps."""
    from edgedeploy.remote.install import write_install_files
    from edgedeploy_agent.unit import SLOT_RESTART_PATH_UNIT, SLOT_RESTART_UNIT, SLOT_UNIT

    spec = dataclasses.replace(_spec(tmp_path), login_user="deploy", slots=("cam2", "plates"))
    work = tmp_path / "work"
    work.mkdir()
    files = write_install_files(spec, work)
    assert set(files.slot_templates) == {SLOT_UNIT, SLOT_RESTART_UNIT, SLOT_RESTART_PATH_UNIT}
    unit = files.slot_templates[SLOT_UNIT].read_text()
    assert "ExecStart=/opt/edgedeploy/venv/bin/edgedeploy-agent --root /var/lib/edgedeploy run --model %i" in unit
    assert "User=edgedeploy" in unit and "ProtectSystem=strict" in unit
    steps = plan_install(parse_install_probe(FRESH_JETSON), spec, files)
    names = [s.name for s in steps]
    tail = names[names.index(f"install {SLOT_UNIT}") :]
    assert tail == [
        f"install {SLOT_UNIT}", f"install {SLOT_RESTART_UNIT}", f"install {SLOT_RESTART_PATH_UNIT}", "reload systemd",
        "enable model cam2", "start edgedeploy-agent-restart@cam2.path",
        "enable model plates", "start edgedeploy-agent-restart@plates.path",
    ]  # fmt: skip
    argv = {s.name: s.argv for s in steps}
    assert argv["enable model cam2"] == ("systemctl", "enable", "edgedeploy-agent@cam2.service")
    assert argv["start edgedeploy-agent-restart@cam2.path"] == (
        "systemctl", "enable", "--now", "edgedeploy-agent-restart@cam2.path"
    )  # fmt: skip
    assert files.sudoers is not None
    rule = files.sudoers.read_text()
    for unit_name in ("edgedeploy-agent.service", "edgedeploy-agent@cam2.service", "edgedeploy-agent@plates.service"):
        assert f"/usr/bin/systemctl restart {unit_name}," in rule and f"/bin/systemctl stop {unit_name}" in rule
    assert "@.service" not in rule and "*" not in rule and rule.count("NOPASSWD") == 1

    have = "".join(
        f"unit_sha256:{n}={hashlib.sha256(f.read_bytes()).hexdigest()}\n" for n, f in files.slot_templates.items()
    )
    done = have + "slot_enabled:cam2=1\nslot_path_active:cam2=1\n"
    again = [s.name for s in plan_install(parse_install_probe(FRESH_JETSON + done), spec, files)]
    assert [n for n in again if "@" in n or "model" in n] == [
        "enable model plates",
        "start edgedeploy-agent-restart@plates.path",
    ]
    done += "slot_enabled:plates=1\nslot_path_active:plates=1\n"
    again = [s.name for s in plan_install(parse_install_probe(FRESH_JETSON + done), spec, files)]
    assert not [n for n in again if "@" in n or "model" in n]

    # no slots: no template; a root a path unit cannot watch: the unit template alone, no restart path
    (tmp_path / "w2").mkdir()
    assert write_install_files(dataclasses.replace(spec, slots=()), tmp_path / "w2").slot_templates == {}
    (tmp_path / "w3").mkdir()
    spaced = write_install_files(dataclasses.replace(spec, root="/srv/edge deploy"), tmp_path / "w3")
    assert set(spaced.slot_templates) == {SLOT_UNIT}
    names = [
        s.name
        for s in plan_install(
            parse_install_probe(FRESH_JETSON), dataclasses.replace(spec, root="/srv/edge deploy"), spaced
        )
    ]
    assert "enable model cam2" in names and not [n for n in names if "restart@" in n]
