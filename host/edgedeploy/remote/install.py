"""`edgedeploy agent install`: bootstrap a device over SSH. Probe (one fixed script + a pure parser),
plan (pure), execute. Every step is planned only when the probe shows it is needed, so a second
run changes nothing.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.unit import UNIT_NAME, render_unit

from ..errors import DeviceError, InputError
from ..inventory import Device
from .transport import Transport

UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
STAMP = ".edgedeploy-install"

SUDOERS_PATH = "/etc/sudoers.d/edgedeploy"
_PORTABLE_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
# Arguments arrive as $1..$8 (never spliced into the script text).
PROBE = r"""
py=$1; venv=$2; root=$3; user=$4; unit=$5; stamp=$6; login=$7; sudoers=$8
echo "uid=$(id -u)"
echo "arch=$(uname -m)"
command -v "$py" >/dev/null 2>&1 && echo "python=$("$py" -c 'import sys;print("%d.%d" % sys.version_info[:2])')"
id "$user" >/dev/null 2>&1 && echo "user_exists=1"
[ -x "$venv/bin/python" ] && echo "venv=1"
[ -f "$venv/$stamp" ] && echo "stamp=$(cat "$venv/$stamp")"
[ -f "$unit" ] && echo "unit_sha256=$(sha256sum "$unit" | cut -d' ' -f1)"
command -v systemctl >/dev/null 2>&1 && echo "systemctl=1"
[ -f /etc/nv_tegra_release ] && echo "jetson=$(head -n1 /etc/nv_tegra_release | tr -d '\n')"
[ -f "$root/agent.json" ] && echo "initialised=1"
[ -L "$root/current" ] && echo "has_release=1"
id -nG "$login" 2>/dev/null | tr ' ' '\n' | grep -qx "$user" && echo "login_in_group=1"
[ -f "$sudoers" ] && echo "sudoers_sha256=$(sha256sum "$sudoers" 2>/dev/null | cut -d' ' -f1)"
[ -f "$root/lib/libtvm_runtime.so" ] && echo "runtime_sha256=$(sha256sum "$root/lib/libtvm_runtime.so" | cut -d' ' -f1)"
true
"""

OPENCV_PROBE = (
    "import re, cv2; info = cv2.getBuildInformation(); "
    "m = re.search(r'^\\s*GStreamer:\\s*(\\S+)', info, re.M); "
    "print(cv2.__version__, 'gstreamer' if m and m.group(1).upper().startswith('YES') else 'v4l2-only')"
)


@dataclass(frozen=True)
class InstallFacts:
    uid: int
    arch: str
    python: str | None
    user_exists: bool
    venv: bool
    stamp: str | None
    unit_sha256: str | None
    systemctl: bool
    jetson: str | None
    initialised: bool
    has_release: bool
    runtime_sha256: str | None
    login_in_group: bool = False
    sudoers_sha256: str | None = None


def parse_install_probe(stdout: str) -> InstallFacts:
    """Pure: the probe's key=value lines -> InstallFacts."""
    kv = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    return InstallFacts(
        uid=int(kv.get("uid", "-1")),
        arch=kv.get("arch", "?"),
        python=kv.get("python") or None,
        user_exists=kv.get("user_exists") == "1",
        venv=kv.get("venv") == "1",
        stamp=kv.get("stamp") or None,
        unit_sha256=kv.get("unit_sha256") or None,
        systemctl=kv.get("systemctl") == "1",
        jetson=kv.get("jetson") or None,
        initialised=kv.get("initialised") == "1",
        has_release=kv.get("has_release") == "1",
        runtime_sha256=kv.get("runtime_sha256") or None,
        login_in_group=kv.get("login_in_group") == "1",
        sudoers_sha256=kv.get("sudoers_sha256") or None,
    )


@dataclass(frozen=True)
class InstallSpec:
    """What the device should end up with."""

    python: str
    venv: str
    root: str
    mode: str  # systemd | process
    user: str
    wheels: tuple[Path, ...]  # the agent's wheel first, then any dependency wheels
    runtime_lib: Path | None
    system_site_packages: bool = False
    offline: bool = False  # dependencies only from the uploaded wheels (--no-index)
    source: str | None = None
    login_user: str | None = None  # the SSH user that will deploy; None or root: nothing to grant

    @property
    def grants_login(self) -> bool:
        """A non-root deploying login needs the sudoers rule (and the service group, unless it is the service user)."""
        return self.mode == "systemd" and self.login_user not in (None, "root")

    def sudoers_text(self) -> str:
        """Lets the deploying login restart/stop/start (and reset the start limit of) the agent's unit, and nothing
        else."""
        # sudoers(5) escapes some characters with a backslash, treats '#' and whitespace specially and
        # differs between sudo versions; a mistake in this file grants root. So the login is refused unless
        # it is a POSIX portable user name (nothing to escape), and `visudo -cf` checks the file before use.
        if not _PORTABLE_USER.fullmatch(str(self.login_user)):
            raise InputError(
                f"login {self.login_user!r} cannot be written into a sudoers rule safely",
                hint="use a login made of letters, digits, '_', '.' and '-' (not starting with '-' or '.')",
            )
        verbs = ("restart", "stop", "start", "reset-failed")
        cmds = ", ".join(f"{d}/systemctl {verb} {UNIT_NAME}" for d in ("/usr/bin", "/bin") for verb in verbs)
        return f"# installed by edgedeploy agent install\n{self.login_user} ALL=(root) NOPASSWD: {cmds}\n"

    @property
    def stamp(self) -> str:
        """Identifies what is installed by the wheels' contents (a rebuilt wheel differs only in zip times)."""
        h = hashlib.sha256()
        for w in self.wheels:
            with zipfile.ZipFile(w) as z:
                for name in sorted(z.namelist()):
                    h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
        return h.hexdigest()[:32]

    def unit_text(self) -> str:
        try:
            return render_unit(
                exec_start=[f"{self.venv}/bin/edgedeploy-agent", "--root", self.root, "run"],
                user=self.user,
                root=self.root,
            )
        except ValueError as e:
            raise InputError(
                f"cannot write the systemd unit: {e}",
                hint="choose --venv and the device's --root without control characters, quotes, backslashes or '$'",
            ) from None


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...] = ()
    put: tuple[Path, str] | None = None  # (local file, remote path)
    root: bool = False  # needs root (sudo -n when the SSH user is not root)


@dataclass
class InstallResult:
    device: str
    steps: list[str]
    facts: InstallFacts
    agent_command: str
    opencv: str = ""
    health: dict[str, Any] = field(default_factory=dict)


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def plan_install(
    facts: InstallFacts, spec: InstallSpec, unit_file: Path | None, sudoers_file: Path | None = None
) -> list[Step]:
    """Pure: the steps still needed on a device that looks like `facts`."""
    if facts.python is None:
        raise DeviceError(
            f"{spec.python} not found on the device",
            hint="on JetPack 5: apt-get install python3.9 python3.9-venv, then --python python3.9 "
            "(docs/agent-service.md)",
        )
    systemd = spec.mode == "systemd"
    if systemd and not facts.systemctl:
        raise DeviceError("the device has no systemctl", hint="install with --service process")
    steps: list[Step] = []
    if systemd and not facts.user_exists:
        steps.append(
            Step(
                "create user",
                ("useradd", "--system", "--user-group", "--groups", "video", "--home-dir", spec.root)
                + ("--no-create-home", "--shell", "/usr/sbin/nologin", spec.user),
                root=True,
            )
        )
    if not facts.venv:
        venv_args = ("--system-site-packages",) if spec.system_site_packages else ()
        steps.append(Step("make venv dir", ("mkdir", "-p", spec.venv), root=systemd))
        steps.append(Step("create venv", (spec.python, "-m", "venv", *venv_args, spec.venv), root=systemd))
    if facts.stamp != spec.stamp:
        wheel_dir = f"{spec.venv}/wheels"
        steps.append(Step("make wheel dir", ("mkdir", "-p", wheel_dir), root=systemd))
        steps += [Step(f"upload {w.name}", put=(w, f"{wheel_dir}/{w.name}"), root=systemd) for w in spec.wheels]
        index = ("--no-index",) if spec.offline else ()
        agent_wheel = f"{wheel_dir}/{spec.wheels[0].name}[agent]"
        pip = (f"{spec.venv}/bin/python", "-m", "pip", "install", "-q", *index, "--find-links", wheel_dir, agent_wheel)
        steps.append(Step("install agent", pip, root=systemd))
        write_stamp = ("sh", "-c", 'printf %s "$1" > "$2"', "sh", spec.stamp, f"{spec.venv}/{STAMP}")
        steps.append(Step("record installed version", write_stamp, root=systemd))
    new_runtime = spec.runtime_lib is not None and facts.runtime_sha256 != _sha256(spec.runtime_lib)
    if spec.runtime_lib is not None and new_runtime:
        steps.append(Step("make lib dir", ("mkdir", "-p", f"{spec.root}/lib"), root=systemd))
        lib = f"{spec.root}/lib/libtvm_runtime.so"
        steps.append(Step("upload TVM runtime", put=(spec.runtime_lib, lib), root=systemd))
    if not facts.initialised or new_runtime:  # init keeps the rest of an existing config
        init = [f"{spec.venv}/bin/edgedeploy-agent", "--root", spec.root, "--json", "init", "--service", spec.mode]
        if spec.runtime_lib is not None:
            init += ["--tvm-runtime-lib", f"{spec.root}/lib/libtvm_runtime.so"]
        if spec.source:
            init += ["--source", spec.source]
        steps.append(Step("initialise agent root", tuple(init), root=systemd))
        if systemd and not facts.initialised:
            # owned by the service user; group-writable and setgid so a deploying login in the group can write
            own = 'chown -R "$1:$1" "$2" && chmod -R g+rwX "$2" && find "$2" -type d -exec chmod g+s {} +'
            steps.append(
                Step("hand the root to the service user", ("sh", "-c", own, "sh", spec.user, spec.root), root=True)
            )
    if spec.grants_login and spec.login_user != spec.user and not facts.login_in_group:
        steps.append(
            Step("add the login to the service group", ("usermod", "-aG", spec.user, str(spec.login_user)), root=True)
        )
    if spec.grants_login and sudoers_file is not None and facts.sudoers_sha256 != _sha256(sudoers_file):
        tmp = "/tmp/edgedeploy-sudoers"
        steps += [
            Step("upload sudoers rule", put=(sudoers_file, tmp)),
            Step("check sudoers rule", ("visudo", "-cf", tmp), root=True),
            Step("install sudoers rule", ("install", "-m", "0440", tmp, SUDOERS_PATH), root=True),
        ]
    if systemd and unit_file is not None and facts.unit_sha256 != _sha256(unit_file):
        steps += [
            Step("install unit", put=(unit_file, UNIT_PATH), root=True),
            Step("reload systemd", ("systemctl", "daemon-reload"), root=True),
            Step("enable unit", ("systemctl", "enable", UNIT_NAME), root=True),
        ]
    if systemd and steps and facts.has_release:
        # without a release the agent has nothing to serve: the first push starts it
        steps.append(Step("restart agent", ("systemctl", "restart", UNIT_NAME), root=True))
    return steps


def write_install_files(spec: InstallSpec, work_dir: Path | None) -> tuple[Path | None, Path | None]:
    """The rendered unit and sudoers rule as local files to upload (systemd mode only)."""
    if spec.mode != "systemd" or work_dir is None:
        return None, None
    unit_file = work_dir / UNIT_NAME
    unit_file.write_text(spec.unit_text(), encoding="utf-8")
    sudoers_file = None
    if spec.grants_login:
        sudoers_file = work_dir / "edgedeploy.sudoers"
        sudoers_file.write_text(spec.sudoers_text(), encoding="utf-8")
    return unit_file, sudoers_file


def probe(transport: Transport, spec: InstallSpec) -> InstallFacts:
    login = spec.login_user or "root"
    argv = [
        "sh",
        "-c",
        PROBE,
        "sh",
        spec.python,
        spec.venv,
        spec.root,
        spec.user,
        UNIT_PATH,
        STAMP,
        login,
        SUDOERS_PATH,
    ]
    r = transport.run(argv, timeout=60)
    if r.exit_code != 0:
        raise DeviceError(f"install probe failed (exit {r.exit_code}): {r.stderr.strip()[-300:]}")
    return parse_install_probe(r.stdout)


def execute_install(
    transport: Transport,
    device: Device,
    spec: InstallSpec,
    step: Callable[[str], None] = lambda s: None,
    work_dir: Path | None = None,
) -> InstallResult:
    facts = probe(transport, spec)
    unit_file, sudoers_file = write_install_files(spec, work_dir)
    steps = plan_install(facts, spec, unit_file, sudoers_file)
    sudo = ["sudo", "-n"] if facts.uid != 0 else []
    for s in steps:
        step(s.name)
        if s.put is not None:
            if s.root and sudo:
                # upload as the SSH user, then move into place as root
                tmp = f"/tmp/edgedeploy-install-{s.put[0].name}"
                transport.put(s.put[0], tmp)
                _run(transport, [*sudo, "install", "-m", "0644", tmp, s.put[1]], s.name)
            else:
                transport.put(s.put[0], s.put[1])
        else:
            _run(transport, [*(sudo if s.root else []), *s.argv], s.name)
    agent = f"{spec.venv}/bin/edgedeploy-agent"
    step("health check")
    # as the service user: a login just added to its group is not in it before its next SSH connection
    as_service = [*sudo, "-u", spec.user] if sudo and spec.mode == "systemd" else []
    health = _json_tail(_run(transport, [*as_service, agent, "--root", spec.root, "--json", "facts"], "health check"))
    opencv = _run(transport, [f"{spec.venv}/bin/python", "-c", OPENCV_PROBE], "opencv check").strip()
    return InstallResult(device.name, [s.name for s in steps], facts, agent, opencv, health)


def _run(transport: Transport, argv: list[str], what: str) -> str:
    r = transport.run(argv, timeout=900)
    if r.exit_code != 0:
        detail = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise DeviceError(f"install step '{what}' failed (exit {r.exit_code}): {detail}", hint=shlex.join(argv))
    return r.stdout


def _json_tail(stdout: str) -> dict[str, Any]:
    import json

    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    data: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return data
