"""The shipped unit passes `systemd-analyze verify` silently and scores <= 4.0 on `security --offline`."""

import os
import re
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from edgedeploy_agent.service import write_restart_request
from edgedeploy_agent.unit import (
    DEFAULT_ROOT,
    FINISH_TIMER,
    FINISH_UNIT,
    RESTART_PATH_UNIT,
    RESTART_UNIT,
    SLOT_RESTART_PATH_UNIT,
    SLOT_RESTART_UNIT,
    SLOT_TEMPLATES,
    SLOT_UNIT,
    WATCH_UNIT,
    render_unit,
)
from tests.helpers import require

MAX_EXPOSURE = 4.0


@pytest.fixture
def analyze() -> str:
    exe = shutil.which("systemd-analyze")
    require("SYSTEMD_ANALYZE", "systemd-analyze not installed (apt-get install systemd)" if exe is None else None)
    assert exe is not None
    return exe


def _unit_for_analysis(tmp_path: Path) -> Path:
    # verify insists that ExecStart exists: point it at this machine's python3, nothing else changes
    python = str(shutil.which("python3"))
    text = render_unit(exec_start=[python, "-m", "edgedeploy_agent", "--root", DEFAULT_ROOT, "run"])
    path = tmp_path / "edgedeploy-agent.service"
    path.write_text(text)
    return path


def test_unit_ships_in_the_agent_package() -> None:
    text = files("edgedeploy_agent").joinpath("systemd/edgedeploy-agent.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "User=edgedeploy", "ProtectSystem=strict"):
        assert line in text


def test_verify_prints_nothing(analyze: str, tmp_path: Path) -> None:
    p = subprocess.run([analyze, "verify", str(_unit_for_analysis(tmp_path))], capture_output=True, text=True)
    # bad values are only warnings (exit 0): any output at all is a failure
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr


def test_verify_catches_a_bad_value(analyze: str, tmp_path: Path) -> None:
    """The check above can fail: a wrong value produces output."""
    unit = _unit_for_analysis(tmp_path)
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert p.returncode == 0 and "sometimes" in p.stdout + p.stderr


def test_security_exposure_is_low(analyze: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(_unit_for_analysis(tmp_path))],
        capture_output=True,
        text=True,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, p.stdout


def test_render_substitutes_paths_and_user() -> None:
    argv = ["/opt/x/bin/edgedeploy-agent", "--root", "/srv/ed", "run"]
    text = render_unit(exec_start=argv, user="cam", root="/srv/ed")
    assert "ExecStart=/opt/x/bin/edgedeploy-agent --root /srv/ed run" in text
    assert "User=cam\nGroup=cam" in text
    assert "ReadWritePaths=/srv/ed" in text
    assert "StateDirectory=edgedeploy" not in text  # only for the default /var/lib/edgedeploy


def test_paths_with_spaces_percent_and_dollar_are_quoted_as_systemd_reads_them(analyze: str, tmp_path: Path) -> None:
    """`systemd-analyze verify` checks that ExecStart's first word is an executable file: an unquoted space
    would cut the path short, an unescaped `%` would be a specifier."""
    venv = tmp_path / "opt 100%" / "bin"
    venv.mkdir(parents=True)
    (venv / "python3").symlink_to(str(shutil.which("python3")))
    root = "/srv/edge deploy/100%"
    argv = [str(venv / "python3"), "-m", "edgedeploy_agent", "--root", root, "--source", "rtsp://cam/$x", "run"]
    text = render_unit(exec_start=argv, root=root)
    exec_line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert exec_line == (
        f'ExecStart="{tmp_path}/opt 100%%/bin/python3" -m edgedeploy_agent --root "/srv/edge deploy/100%%" '
        '--source "rtsp://cam/$$x" run'
    )
    assert 'ReadWritePaths="/srv/edge deploy/100%%"' in text
    unit = tmp_path / "edgedeploy-agent.service"
    unit.write_text(text)
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr


AGENT_ARGV = ["/opt/v/bin/edgedeploy-agent", "run"]


@pytest.mark.parametrize(
    ("argv", "user", "root", "refused"),
    [
        (AGENT_ARGV, "edgedeploy", "/x\nExecStartPre=/bin/sh", "agent root"),  # a newline would add a line
        (AGENT_ARGV, "edgedeploy", "/x\\y", "agent root"),
        (["/opt/v\n/bin/edgedeploy-agent", "run"], "edgedeploy", DEFAULT_ROOT, "ExecStart executable"),
        (["/opt/v/bin/edgedeploy-agent", "--root", '/"v"'], "edgedeploy", DEFAULT_ROOT, "ExecStart argument"),
        (["/opt/$v/bin/edgedeploy-agent", "run"], "edgedeploy", DEFAULT_ROOT, "holds a '\\$'"),
        (AGENT_ARGV, "edge\ndeploy", DEFAULT_ROOT, "service user"),
        (AGENT_ARGV, "root; rm", DEFAULT_ROOT, "service user"),
    ],
)
def test_control_characters_quotes_and_odd_users_are_refused(
    argv: list[str], user: str, root: str, refused: str
) -> None:
    with pytest.raises(ValueError, match=refused):
        render_unit(exec_start=argv, user=user, root=root)


def _exposure(analyze: str, unit: Path) -> float:
    p = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout)
    assert m, p.stdout + p.stderr
    return float(m.group(1))


def test_watch_unit_verifies_silently_and_is_locked_down(analyze: str, tmp_path: Path) -> None:
    """The second unit (`edgedeploy-agent watch`, pull rollouts) beside the inference service."""
    python = str(shutil.which("python3"))
    unit = tmp_path / WATCH_UNIT
    unit.write_text(render_unit([python, "-m", "edgedeploy_agent", "--root", DEFAULT_ROOT, "watch"], name=WATCH_UNIT))
    assert f"ExecStart={python} -m edgedeploy_agent --root {DEFAULT_ROOT} watch" in unit.read_text()
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
    assert _exposure(analyze, unit) <= MAX_EXPOSURE


def test_restart_path_unit_and_its_root_oneshot_verify_and_are_locked_down(analyze: str, tmp_path: Path) -> None:
    """Restarts without sudo (docs/agent-service.md): the path unit watches ROOT/run/restart-request and starts
    a root oneshot that restarts the inference unit only, with no network and no capabilities."""
    for name in (RESTART_PATH_UNIT, RESTART_UNIT):
        (tmp_path / name).write_text(render_unit(root="/srv/ed", name=name))
    assert "PathChanged=/srv/ed/run/restart-request" in (tmp_path / RESTART_PATH_UNIT).read_text()
    oneshot = (tmp_path / RESTART_UNIT).read_text()
    commands = [ln for ln in oneshot.splitlines() if ln.startswith("ExecStart")]
    assert commands == [
        "ExecStart=-/bin/systemctl reset-failed edgedeploy-agent.service",
        "ExecStart=/bin/systemctl restart --no-block edgedeploy-agent.service",
    ]
    for line in ("NoNewPrivileges=yes", "CapabilityBoundingSet=\n", "RestrictAddressFamilies=AF_UNIX\n"):
        assert line in oneshot
    p = subprocess.run([analyze, "verify", *(str(tmp_path / n) for n in (RESTART_PATH_UNIT, RESTART_UNIT))],
                       capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
    assert _exposure(analyze, tmp_path / RESTART_UNIT) <= 2.0


def test_the_finisher_and_its_timer_verify_and_the_finisher_is_locked_down(analyze: str, tmp_path: Path) -> None:
    """edgedeploy-agent-finish.timer starts the finisher (recover --finish) after boot and every minute, in a unit of
    its own: the inference unit's restart cannot kill it, and it runs while that unit is stopped."""
    python = str(shutil.which("python3"))
    argv = [python, "-m", "edgedeploy_agent", "--root", DEFAULT_ROOT, "--json", "recover", "--finish"]
    (tmp_path / FINISH_UNIT).write_text(render_unit(argv, name=FINISH_UNIT))
    (tmp_path / FINISH_TIMER).write_text(render_unit(name=FINISH_TIMER))
    timer = (tmp_path / FINISH_TIMER).read_text()
    assert f"Unit={FINISH_UNIT}" in timer and "OnBootSec=" in timer and "OnUnitInactiveSec=" in timer
    p = subprocess.run([analyze, "verify", *(str(tmp_path / n) for n in (FINISH_UNIT, FINISH_TIMER))],
                       capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
    assert _exposure(analyze, tmp_path / FINISH_UNIT) <= MAX_EXPOSURE


def test_the_restart_units_refuse_what_they_cannot_carry() -> None:
    with pytest.raises(ValueError, match="fixed command lines"):
        render_unit(["/bin/sh", "-c", "id"], name=RESTART_UNIT)
    with pytest.raises(ValueError, match="path unit cannot carry"):
        render_unit(root="/srv/edge deploy", name=RESTART_PATH_UNIT)


def test_a_restart_request_is_group_writable_whatever_the_umask(tmp_path: Path) -> None:
    """The watch service (UMask=0027) and the deploying login (another user, same group) both rewrite it."""
    request = tmp_path / "restart-request"
    old = os.umask(0o027)
    try:
        write_restart_request(request, "one\n")
        write_restart_request(request, "two\n")
    finally:
        os.umask(old)
    assert request.read_text() == "two\n" and request.stat().st_mode & 0o777 == 0o660


def test_slot_templates_are_the_default_units_for_the_instance_with_the_same_user_and_hardening() -> None:
    """A model slot's units differ from the default's only in what names the slot (%i): the description, the
    agent's `--model %i`, the unit the restart oneshot restarts and the request its path unit watches."""
    argv = ["/opt/x/bin/edgedeploy-agent", "--root", "/srv/ed", "run"]
    differ = ("#", "Description=", "ExecStart=", "PathChanged=", "Unit=")
    for template, base in SLOT_TEMPLATES.items():
        given = argv if template == SLOT_UNIT else None
        slot_lines = render_unit(given, user="cam", root="/srv/ed", name=template).splitlines()
        base_lines = render_unit(given, user="cam", root="/srv/ed", name=base).splitlines()
        same = [ln for ln in base_lines if not ln.startswith(differ)]
        assert [ln for ln in slot_lines if not ln.startswith(differ)] == same, template
        assert len(same) > 5
    unit = render_unit(argv, user="cam", root="/srv/ed", name=SLOT_UNIT)
    assert "ExecStart=/opt/x/bin/edgedeploy-agent --root /srv/ed run --model %i\n" in unit
    assert "User=cam\nGroup=cam" in unit and "NoNewPrivileges=yes" in unit and "ReadWritePaths=/srv/ed" in unit
    oneshot = render_unit(root="/srv/ed", name=SLOT_RESTART_UNIT)
    assert [ln for ln in oneshot.splitlines() if ln.startswith("ExecStart")] == [
        "ExecStart=-/bin/systemctl reset-failed edgedeploy-agent@%i.service",
        "ExecStart=/bin/systemctl restart --no-block edgedeploy-agent@%i.service",
    ]
    path = render_unit(root="/srv/ed", name=SLOT_RESTART_PATH_UNIT)
    assert "PathChanged=/srv/ed/models/%i/run/restart-request\n" in path
    assert "Unit=edgedeploy-agent-restart@%i.service\n" in path
    with pytest.raises(ValueError, match="fixed command lines"):
        render_unit(["/bin/sh", "-c", "id"], name=SLOT_RESTART_UNIT)


def test_a_slots_units_verify_silently_as_instances_and_are_locked_down(analyze: str, tmp_path: Path) -> None:
    """systemd-analyze loads each instance (edgedeploy-agent@cam2.service, ...) from its template, silently; a
    broken template is caught (the check can fail); the instance scores as the default unit must."""
    python = str(shutil.which("python3"))
    argv = [python, "-m", "edgedeploy_agent", "--root", DEFAULT_ROOT, "run"]
    for name in SLOT_TEMPLATES:
        (tmp_path / name).write_text(render_unit(argv if name == SLOT_UNIT else None, name=name))
    instances = [str(tmp_path / n.replace("@.", "@cam2.")) for n in SLOT_TEMPLATES]
    p = subprocess.run([analyze, "verify", *instances], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
    assert _exposure(analyze, tmp_path / "edgedeploy-agent@cam2.service") <= MAX_EXPOSURE
    assert _exposure(analyze, tmp_path / "edgedeploy-agent-restart@cam2.service") <= 2.0
    template = tmp_path / SLOT_UNIT
    template.write_text(template.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    p = subprocess.run([analyze, "verify", instances[0]], capture_output=True, text=True)
    assert "sometimes" in p.stdout + p.stderr
