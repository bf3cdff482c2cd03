"""`edgedeploy agent install`'s facts and plan: the probe (one fixed script + a pure parser), what the device
should end up with (InstallSpec), and the pure planner, part by part (PLAN_PARTS). Every step is planned
only when the probe shows it is needed, so a second run changes nothing. remote/install_run.py runs it.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from edgedeploy_agent.names import DEFAULT_SLOT
from edgedeploy_agent.unit import (
    FINISH_TIMER,
    FINISH_UNIT,
    HELPER_UNITS,
    RESTART_PATH_UNIT,
    RESTART_UNIT,
    SLOT_RESTART_PATH_UNIT,
    SLOT_TEMPLATES,
    SLOT_UNIT,
    UNIT_NAME,
    instance,
    render_unit,
    slot_unit,
)

from ..cuda_backend import LIBRARY as CUDA_BACKEND
from ..errors import DeviceError, InputError
from .transport import Transport

if TYPE_CHECKING:
    from .install_pull import PullOptions

UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
STAMP = ".edgedeploy-install"

SUDOERS_PATH = "/etc/sudoers.d/edgedeploy"
_PORTABLE_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
# Arguments arrive as $1..$11 (never spliced into the script text); ${11}: the model slots besides default, each a
# slot name (names.py: nothing a shell splits or expands), separated by spaces.
PROBE = r"""
py=$1; venv=$2; root=$3; user=$4; unit=$5; stamp=$6; login=$7; sudoers=$8; syspy=$9; sidecar=${10}; slots=${11}
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
# a release in the default model slot, or at the top of a root from before slots (the agent moves it on start)
{ [ -L "$root/models/default/current" ] || [ -L "$root/current" ]; } && echo "has_release=1"
id -nG "$login" 2>/dev/null | tr ' ' '\n' | grep -qx "$user" && echo "login_in_group=1"
# the rule is root's (0440): a non-root login reads it through sudo (the install's grant), else it is planned again
[ -f "$sudoers" ] && echo "sudoers_sha256=$( (sha256sum "$sudoers" || sudo -n sha256sum "$sudoers") 2>/dev/null |
  cut -d' ' -f1)"
[ -f "$root/lib/libtvm_runtime.so" ] && echo "runtime_sha256=$(sha256sum "$root/lib/libtvm_runtime.so" | cut -d' ' -f1)"
[ -f "$root/lib/libedgedeploy_cuda.so" ] && echo "cuda_backend_sha256=$(sha256sum "$root/lib/libedgedeploy_cuda.so" |
  cut -d' ' -f1)"
# an NVIDIA driver (a Jetson's comes with L4T, the jetson line above): only then does the device need a CUDA backend
/sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && echo "cuda_driver=1"
for u in edgedeploy-agent-restart.service edgedeploy-agent-restart.path edgedeploy-agent-finish.service \
  edgedeploy-agent-finish.timer edgedeploy-agent@.service edgedeploy-agent-restart@.service \
  edgedeploy-agent-restart@.path; do
  [ -f "/etc/systemd/system/$u" ] && echo "unit_sha256:$u=$(sha256sum "/etc/systemd/system/$u" | cut -d' ' -f1)"
done
# each model slot's units (instances of the templates): enabled, and the restart path unit running
for s in $slots; do
  systemctl is-enabled --quiet "edgedeploy-agent@$s.service" 2>/dev/null && echo "slot_enabled:$s=1"
  systemctl is-active --quiet "edgedeploy-agent-restart@$s.path" 2>/dev/null && echo "slot_path_active:$s=1"
done
# JetPack's system Python (TensorRT's bindings and NVIDIA's GStreamer OpenCV live there) and the sidecar venv made
# from it; TensorRT is looked up, not imported (seconds, and a crash without a driver)
if [ -n "$syspy" ] && [ -x "$syspy" ]; then "$syspy" - 2>/dev/null <<'PY'
import importlib.util, platform, re
print("system_python=" + platform.python_version())
if importlib.util.find_spec("tensorrt") is not None:
    try:
        from importlib import metadata
        print("system_tensorrt=" + metadata.version("tensorrt"))
    except Exception:
        print("system_tensorrt=unknown")
try:
    import cv2
    m = re.search(r"^\s*GStreamer:\s*(\S+)", cv2.getBuildInformation(), re.M)
    print("system_opencv=" + cv2.__version__)
    print("system_gstreamer=" + ("1" if m and m.group(1).upper().startswith("YES") else "0"))
except Exception:
    pass
PY
fi
[ -n "$sidecar" ] && [ -x "$sidecar/bin/python" ] && echo "sidecar_venv=1" &&
  "$sidecar/bin/python" -c 'import polygraphy' 2>/dev/null && echo "sidecar_polygraphy=1"
true
"""


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
    cuda_backend_sha256: str | None = None
    cuda_driver: bool = False  # libcuda.so.1 is known to the dynamic linker
    system_python: str | None = None  # the version of the system Python probed (spec.system_python), if it runs
    system_tensorrt: str | None = None  # its TensorRT bindings' version ("unknown" without metadata)
    system_opencv: str | None = None
    system_gstreamer: bool = False
    sidecar_venv: bool = False  # the venv made from the system Python exists
    sidecar_polygraphy: bool = False  # ... with Polygraphy in it
    helper_units_sha256: dict[str, str] = field(default_factory=dict)  # HELPER_UNITS, SLOT_TEMPLATES, by name
    slots_enabled: frozenset[str] = frozenset()  # model slots whose units are enabled
    slot_paths_active: frozenset[str] = frozenset()  # ... whose restart path units run

    @property
    def nvidia(self) -> bool:
        """An NVIDIA GPU stack: a driver, or a Jetson (L4T)."""
        return self.cuda_driver or self.jetson is not None


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
        cuda_backend_sha256=kv.get("cuda_backend_sha256") or None,
        cuda_driver=kv.get("cuda_driver") == "1",
        system_python=kv.get("system_python") or None,
        system_tensorrt=kv.get("system_tensorrt") or None,
        system_opencv=kv.get("system_opencv") or None,
        system_gstreamer=kv.get("system_gstreamer") == "1",
        sidecar_venv=kv.get("sidecar_venv") == "1",
        sidecar_polygraphy=kv.get("sidecar_polygraphy") == "1",
        helper_units_sha256={k.split(":", 1)[1]: v for k, v in kv.items() if k.startswith("unit_sha256:")},
        slots_enabled=frozenset(k.split(":", 1)[1] for k in kv if k.startswith("slot_enabled:")),
        slot_paths_active=frozenset(k.split(":", 1)[1] for k in kv if k.startswith("slot_path_active:")),
    )


@dataclass(frozen=True)
class InstallOptions:
    """What `agent install` was asked for (the device's inventory entry gives the rest)."""

    python: str = "python3"
    venv: str = "/opt/edgedeploy/venv"
    wheelhouse: Path | None = None
    runtime_lib: Path | None = None
    offline: bool = False  # dependencies only from the wheelhouse
    system_site_packages: bool = False
    # JetPack's Python for TensorRT and GStreamer capture (the agent's sidecar): "auto" = /usr/bin/python3.8 on a
    # Jetson, a path, or None for none
    system_python: str | None = "auto"
    pull: PullOptions | None = None  # --mqtt: set the device up for pull rollouts (remote/install_pull.py)


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
    source_args: tuple[str, ...] = ()  # the device's --source options (Device.source_args)
    login_user: str | None = None  # the SSH user that will deploy; None or root: nothing to grant
    cuda_backend_lib: Path | None = None  # libedgedeploy_cuda.so for the device's architecture
    system_python: str | None = None  # the system Python to probe (and, when it has what the agent lacks, to use)
    sidecar: bool = False  # decided from the probe: make the sidecar venv from system_python and point the agent at it
    slots: tuple[str, ...] = ()  # the model slots besides `default` the inventory names: a unit each (systemd mode)

    @property
    def sidecar_venv(self) -> str:
        """A venv of the system Python that sees its packages (TensorRT, OpenCV, numpy), plus Polygraphy."""
        return f"{self.venv}-system"

    @property
    def as_root(self) -> bool:
        """Venv, wheels, runtime and agent root: made as root in systemd mode, as the login in process mode."""
        return self.mode == "systemd"

    @property
    def grants_login(self) -> bool:
        """A non-root deploying login needs the sudoers rule (and the service group, unless it is the service user)."""
        return self.mode == "systemd" and self.login_user not in (None, "root")

    def sudoers_text(self) -> str:
        """Lets the deploying login restart/stop/start (and reset the start limit of) the agent's units (one per model
        slot), and nothing else."""
        # sudoers(5) escapes some characters with a backslash, treats '#' and whitespace specially and
        # differs between sudo versions; a mistake in this file grants root. So the login is refused unless
        # it is a POSIX portable user name (nothing to escape), and `visudo -cf` checks the file before use.
        if not _PORTABLE_USER.fullmatch(str(self.login_user)):
            raise InputError(
                f"login {self.login_user!r} cannot be written into a sudoers rule safely",
                hint="use a login made of letters, digits, '_', '.' and '-' (not starting with '-' or '.')",
            )
        verbs = ("restart", "stop", "start", "reset-failed")
        units = [slot_unit(slot) for slot in (DEFAULT_SLOT, *self.slots)]
        cmds = ", ".join(
            f"{d}/systemctl {verb} {unit}" for unit in units for d in ("/usr/bin", "/bin") for verb in verbs
        )
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

    def unit_text(self, name: str = UNIT_NAME) -> str:
        """The agent's unit, or its template for the other model slots (SLOT_UNIT)."""
        try:
            return render_unit(
                exec_start=[f"{self.venv}/bin/edgedeploy-agent", "--root", self.root, "run"],
                user=self.user,
                root=self.root,
                name=name,
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


class InstallFiles(NamedTuple):
    """The rendered files a plan uploads (systemd mode only; None: nothing of that kind to install)."""

    unit: Path | None = None
    sudoers: Path | None = None
    helpers: dict[str, Path] = {}  # HELPER_UNITS by name
    slot_templates: dict[str, Path] = {}  # SLOT_TEMPLATES by name, when the inventory names model slots


NO_FILES = InstallFiles()


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _check_device(facts: InstallFacts, spec: InstallSpec) -> None:
    if facts.python is None:
        raise DeviceError(
            f"{spec.python} not found on the device",
            hint="on JetPack 5: apt-get install python3.9 python3.9-venv, then --python python3.9 "
            "(docs/agent-service.md)",
        )
    if spec.mode == "systemd" and not facts.systemctl:
        raise DeviceError("the device has no systemctl", hint="install with --service process")


def _service_user(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    if spec.mode != "systemd" or facts.user_exists:
        return []
    useradd = ("useradd", "--system", "--user-group", "--groups", "video", "--home-dir", spec.root)
    return [Step("create user", (*useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", spec.user), root=True)]


def _venv(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    if facts.venv:
        return []
    venv_args = ("--system-site-packages",) if spec.system_site_packages else ()
    return [
        Step("make venv dir", ("mkdir", "-p", spec.venv), root=spec.as_root),
        Step("create venv", (spec.python, "-m", "venv", *venv_args, spec.venv), root=spec.as_root),
    ]


def _agent_wheels(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    if facts.stamp == spec.stamp:
        return []
    wheel_dir = f"{spec.venv}/wheels"
    steps = [Step("make wheel dir", ("mkdir", "-p", wheel_dir), root=spec.as_root)]
    steps += [Step(f"upload {w.name}", put=(w, f"{wheel_dir}/{w.name}"), root=spec.as_root) for w in spec.wheels]
    index = ("--no-index",) if spec.offline else ()
    agent_wheel = f"{wheel_dir}/{spec.wheels[0].name}[agent]"
    pip = (f"{spec.venv}/bin/python", "-m", "pip", "install", "-q", *index, "--find-links", wheel_dir, agent_wheel)
    write_stamp = ("sh", "-c", 'printf %s "$1" > "$2"', "sh", spec.stamp, f"{spec.venv}/{STAMP}")
    return [
        *steps,
        Step("install agent", pip, root=spec.as_root),
        Step("record installed version", write_stamp, root=spec.as_root),
    ]


def _new_libraries(facts: InstallFacts, spec: InstallSpec) -> list[tuple[Path, str, str]]:
    """(local file, name in ROOT/lib, step) of each library the device lacks these bytes of: the TVM runtime and
    edgedeploy's CUDA backend (CUDA 11.4+ drivers), where the spec has them."""
    wanted = (
        (spec.runtime_lib, "libtvm_runtime.so", "upload TVM runtime", facts.runtime_sha256),
        (spec.cuda_backend_lib, CUDA_BACKEND, "upload CUDA backend", facts.cuda_backend_sha256),
    )
    return [(lib, name, step) for lib, name, step, have in wanted if lib is not None and have != _sha256(lib)]


def _libraries(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    new = _new_libraries(facts, spec)
    if not new:
        return []
    mkdir = Step("make lib dir", ("mkdir", "-p", f"{spec.root}/lib"), root=spec.as_root)
    return [mkdir, *(Step(step, put=(lib, f"{spec.root}/lib/{name}"), root=spec.as_root) for lib, name, step in new)]


def _sidecar_venv(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    """JetPack's route: a venv of the system Python with its packages visible, and Polygraphy (pure Python, from
    the agent's wheels: the tensorrt extra) where TensorRT is there; the agent's sidecar worker runs in it."""
    if not spec.sidecar or spec.system_python is None:
        return []
    steps = []
    if not facts.sidecar_venv:
        venv = (spec.system_python, "-m", "venv", "--system-site-packages", spec.sidecar_venv)
        steps.append(Step("create system-Python venv", venv, root=spec.as_root))
    if facts.system_tensorrt and not facts.sidecar_polygraphy:
        index = ("--no-index",) if spec.offline else ()
        pip = (f"{spec.sidecar_venv}/bin/python", "-m", "pip", "install", "-q", *index, "--find-links")
        steps.append(Step("install polygraphy", (*pip, f"{spec.venv}/wheels", "polygraphy"), root=spec.as_root))
    return steps


def _agent_root(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    # init keeps the rest of an existing config
    if facts.initialised and not _new_libraries(facts, spec) and (facts.sidecar_venv or not spec.sidecar):
        return []
    init = [f"{spec.venv}/bin/edgedeploy-agent", "--root", spec.root, "--json", "init", "--service", spec.mode]
    if spec.runtime_lib is not None:
        init += ["--tvm-runtime-lib", f"{spec.root}/lib/libtvm_runtime.so"]
    if spec.cuda_backend_lib is not None:
        init += ["--cuda-backend-lib", f"{spec.root}/lib/{CUDA_BACKEND}"]
    if spec.sidecar:
        init += ["--system-python", f"{spec.sidecar_venv}/bin/python"]
    init += spec.source_args
    steps = [Step("initialise agent root", tuple(init), root=spec.as_root)]
    if spec.mode == "systemd" and not facts.initialised:
        # owned by the service user; group-writable and setgid so a deploying login in the group can write
        own = 'chown -R "$1:$1" "$2" && chmod -R g+rwX "$2" && find "$2" -type d -exec chmod g+s {} +'
        steps.append(
            Step("hand the root to the service user", ("sh", "-c", own, "sh", spec.user, spec.root), root=True)
        )
    return steps


def _login_group(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    if not spec.grants_login or spec.login_user == spec.user or facts.login_in_group:
        return []
    return [Step("add the login to the service group", ("usermod", "-aG", spec.user, str(spec.login_user)), root=True)]


def _sudoers(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    if not spec.grants_login or files.sudoers is None or facts.sudoers_sha256 == _sha256(files.sudoers):
        return []
    tmp = "/tmp/edgedeploy-sudoers"
    return [
        Step("upload sudoers rule", put=(files.sudoers, tmp)),
        Step("check sudoers rule", ("visudo", "-cf", tmp), root=True),
        Step("install sudoers rule", ("install", "-m", "0440", tmp, SUDOERS_PATH), root=True),
    ]


def _helper_units(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    """Restarts without sudo (the restart path unit and its root oneshot) and the finisher with its timer, which
    uses them: a deploy cut off with its host is finished on the device (docs/agent-service.md)."""
    if spec.mode != "systemd" or not files.helpers:
        return []
    unit_dir, have = "/etc/systemd/system", facts.helper_units_sha256
    steps = [
        Step(f"install {name}", put=(files.helpers[name], f"{unit_dir}/{name}"), root=True)
        for name in (RESTART_UNIT, FINISH_UNIT)  # oneshots without [Install]: installed, never enabled
        if have.get(name) != _sha256(files.helpers[name])
    ]
    if steps:
        steps.append(Step("reload systemd", ("systemctl", "daemon-reload"), root=True))
    started = []
    for name in (RESTART_PATH_UNIT, FINISH_TIMER):
        new = unit_steps(files.helpers[name], f"{unit_dir}/{name}", have.get(name), label=name)
        steps += new
        started += [name] if new else []
    if started:
        steps.append(Step(f"start {' and '.join(started)}", ("systemctl", "restart", *started), root=True))
    return steps


def _slot_units(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    """The templates that serve the model slots besides `default`, and per slot: its unit enabled (started by its
    first push, as the default's) and its restart path unit enabled and started (docs/agent-service.md)."""
    if spec.mode != "systemd" or not files.slot_templates:
        return []
    have = facts.helper_units_sha256
    steps = [
        Step(f"install {name}", put=(path, f"/etc/systemd/system/{name}"), root=True)
        for name, path in files.slot_templates.items()
        if have.get(name) != _sha256(path)
    ]
    if steps:
        steps.append(Step("reload systemd", ("systemctl", "daemon-reload"), root=True))
    for slot in spec.slots:
        if slot not in facts.slots_enabled:
            steps.append(Step(f"enable model {slot}", ("systemctl", "enable", instance(SLOT_UNIT, slot)), root=True))
        if SLOT_RESTART_PATH_UNIT in files.slot_templates and slot not in facts.slot_paths_active:
            path_unit = instance(SLOT_RESTART_PATH_UNIT, slot)
            steps.append(Step(f"start {path_unit}", ("systemctl", "enable", "--now", path_unit), root=True))
    return steps


def unit_steps(unit_file: Path, unit_path: str, installed_sha256: str | None, label: str = "unit") -> list[Step]:
    """Install a systemd unit file at `unit_path`, reload systemd, enable the unit; nothing when the device
    already has these bytes there (`installed_sha256`, from the probe)."""
    if installed_sha256 == _sha256(unit_file):
        return []
    return [
        Step(f"install {label}", put=(unit_file, unit_path), root=True),
        Step("reload systemd", ("systemctl", "daemon-reload"), root=True),
        Step(f"enable {label}", ("systemctl", "enable", Path(unit_path).name), root=True),
    ]


def _unit(facts: InstallFacts, spec: InstallSpec, files: InstallFiles) -> list[Step]:
    if spec.mode != "systemd" or files.unit is None:
        return []
    return unit_steps(files.unit, UNIT_PATH, facts.unit_sha256)


Planner = Callable[[InstallFacts, InstallSpec, InstallFiles], list[Step]]
# The install, part by part, in the order it runs. Each part plans its steps from the facts alone (nothing
# when the device already has it), so a second run changes nothing. A new part joins this tuple with what
# it needs: a probe line for what it checks, an InstallFacts field, a rendered file in InstallFiles (a
# second systemd unit: unit_steps).
PLAN_PARTS: tuple[Planner, ...] = (
    _service_user,
    _venv,
    _agent_wheels,
    _libraries,
    _sidecar_venv,
    _agent_root,
    _login_group,
    _sudoers,
    _unit,
    _helper_units,
    _slot_units,
)


def plan_install(facts: InstallFacts, spec: InstallSpec, files: InstallFiles = NO_FILES) -> list[Step]:
    """Pure: the steps still needed on a device that looks like `facts`."""
    _check_device(facts, spec)
    steps = [s for part in PLAN_PARTS for s in part(facts, spec, files)]
    if spec.mode == "systemd" and steps and facts.has_release:
        # without a release the agent has nothing to serve: the first push starts it
        steps.append(Step("restart agent", ("systemctl", "restart", UNIT_NAME), root=True))
    return steps


def write_install_files(spec: InstallSpec, work_dir: Path | None) -> InstallFiles:
    """The rendered unit and sudoers rule as local files to upload (systemd mode only)."""
    if spec.mode != "systemd" or work_dir is None:
        return NO_FILES
    unit_file = work_dir / UNIT_NAME
    unit_file.write_text(spec.unit_text(), encoding="utf-8")
    helpers = {}
    # a path unit cannot watch a path with spaces or '%' (unit.restart_request_path): such a root gets neither
    # restarts without sudo nor the finisher, as before they existed (the next deploy recovers a cut-off one)
    argv = [f"{spec.venv}/bin/edgedeploy-agent", "--root", spec.root, "--json", "recover", "--finish"]
    try:
        rendered = {
            name: render_unit(argv if name == FINISH_UNIT else None, user=spec.user, root=spec.root, name=name)
            for name in HELPER_UNITS
        }
    except ValueError:
        rendered = {}
    for name, text in rendered.items():
        (work_dir / name).write_text(text, encoding="utf-8")
        helpers[name] = work_dir / name
    slot_templates = {}
    for name in SLOT_TEMPLATES if spec.slots else ():
        if name != SLOT_UNIT and not rendered:  # a root a path unit cannot watch: the unit alone
            continue
        text = spec.unit_text(name) if name == SLOT_UNIT else render_unit(user=spec.user, root=spec.root, name=name)
        (work_dir / name).write_text(text, encoding="utf-8")
        slot_templates[name] = work_dir / name
    sudoers_file = None
    if spec.grants_login:
        sudoers_file = work_dir / "edgedeploy.sudoers"
        sudoers_file.write_text(spec.sudoers_text(), encoding="utf-8")
    return InstallFiles(unit_file, sudoers_file, helpers, slot_templates)


def run_probe(transport: Transport, spec: InstallSpec, extra: str = "") -> str:
    """The probe's output; `extra` is more of the same script (remote/install_pull.py's lines), so an install
    with every option still asks the device once."""
    login = spec.login_user or "root"
    args = [spec.python, spec.venv, spec.root, spec.user, UNIT_PATH, STAMP, login, SUDOERS_PATH]
    args += [spec.system_python or "", spec.sidecar_venv if spec.system_python else "", " ".join(spec.slots)]
    r = transport.run(["sh", "-c", PROBE + extra, "sh", *args], timeout=60)
    if r.exit_code != 0:
        raise DeviceError(f"install probe failed (exit {r.exit_code}): {r.stderr.strip()[-300:]}")
    return r.stdout
