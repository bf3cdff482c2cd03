"""`edgedeploy agent install` from start to end: the agent's wheels, one probe of the device, the plan
built from that probe (remote/install.py), its execution, the health check, and the inventory pointed at
the installed agent. The device is probed once per install: the executor runs a plan, it never asks again.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import DeviceError, InputError
from ..inventory import Device, Inventory
from .connect import connected
from .install import (
    InstallFacts,
    InstallOptions,
    InstallSpec,
    Step,
    parse_install_probe,
    plan_install,
    run_probe,
    write_install_files,
)
from .install_pull import PULL_PROBE, PullFiles, parse_pull_probe, plan_pull, record_broker_user, write_pull_files
from .transport import Transport
from .wheelhouse import check_wheelhouse
from .wheels import agent_wheels, cuda_backend_for, default_runtime_lib

OPENCV_PROBE = (
    "import re, cv2; info = cv2.getBuildInformation(); "
    "m = re.search(r'^\\s*GStreamer:\\s*(\\S+)', info, re.M); "
    "print(cv2.__version__, 'gstreamer' if m and m.group(1).upper().startswith('YES') else 'v4l2-only')"
)


@dataclass(frozen=True)
class InstallPlan:
    """The device as the one probe found it, the spec fitted to it, and the steps still needed."""

    facts: InstallFacts
    spec: InstallSpec
    steps: list[Step]
    pull_files: PullFiles | None = None  # --mqtt: the broker password the plan may upload
    cuda_backend: str = ""  # where libedgedeploy_cuda.so came from, or why it is not installed
    system_python: str = ""  # what the system Python has and whether the agent's sidecar uses it


@dataclass
class InstallResult:
    device: str
    steps: list[str]
    facts: InstallFacts
    agent_command: str
    opencv: str = ""
    health: dict[str, Any] = field(default_factory=dict)


def install_spec(dev: Device, options: InstallOptions, wheels: list[Path]) -> InstallSpec:
    """What `dev` should end up with: its inventory entry plus the command's options."""
    return InstallSpec(
        python=options.python,
        venv=options.venv,
        root=dev.root,
        mode=dev.service,
        user=dev.user if dev.service == "process" else "edgedeploy",
        wheels=tuple(wheels),
        runtime_lib=options.runtime_lib,
        system_site_packages=options.system_site_packages,
        offline=options.offline,
        source_args=tuple(dev.source_args()),
        slots=tuple(sorted(dev.models)),
        login_user=dev.user,
        system_python=AUTO_SYSTEM_PYTHON if options.system_python == "auto" else options.system_python,
    )


AUTO_SYSTEM_PYTHON = "/usr/bin/python3.8"  # JetPack 5's, with TensorRT's bindings and NVIDIA's OpenCV


def choose_sidecar(facts: InstallFacts, spec: InstallSpec, options: InstallOptions) -> tuple[InstallSpec, str]:
    """Whether the agent gets a sidecar under the system Python (and what was found, in words). Automatic on a
    Jetson whose system Python has TensorRT or a GStreamer OpenCV; a --system-python given must run."""
    if spec.system_python is None:
        return spec, "not used (--system-python none)"
    if facts.system_python is None:
        if options.system_python != "auto":
            raise DeviceError(
                f"--system-python {spec.system_python} does not run on the device",
                hint="on JetPack 5 it is /usr/bin/python3.8 (python3-libnvinfer brings TensorRT's bindings)",
            )
        return replace(spec, system_python=None), f"not used: no {spec.system_python} on the device"
    gst = "with GStreamer" if facts.system_gstreamer else "without GStreamer"
    found = f"{spec.system_python} is Python {facts.system_python}: TensorRT {facts.system_tensorrt or 'no'}, " + (
        f"OpenCV {facts.system_opencv} {gst}" if facts.system_opencv else "no OpenCV"
    )
    useful = facts.system_tensorrt is not None or facts.system_gstreamer
    if options.system_python == "auto" and not (facts.jetson and useful):
        return replace(spec, system_python=None), f"not used ({found}; not a Jetson, or nothing the agent lacks)"
    if facts.system_tensorrt and spec.offline and not any(w.name.startswith("polygraphy-") for w in spec.wheels):
        raise InputError(
            f"the device's system Python has TensorRT {facts.system_tensorrt}, but the wheelhouse has no polygraphy "
            "wheel for the agent's TensorRT sidecar",
            hint="make the wheelhouse with `edgedeploy agent wheelhouse --extra tensorrt` (polygraphy is pure "
            "Python: the same wheel serves the agent's Python and the system's 3.8)",
        )
    return replace(spec, sidecar=True), f"{found}; TensorRT and GStreamer capture run there ({spec.sidecar_venv})"


def plan_on(transport: Transport, spec: InstallSpec, options: InstallOptions, work_dir: Path) -> InstallPlan:
    """Probe the device (the one time), refuse a wheelhouse made for another device, pick the TVM runtime
    for its architecture, and plan."""
    stdout = run_probe(transport, spec, PULL_PROBE if options.pull else "")
    facts = parse_install_probe(stdout)
    if options.offline and options.wheelhouse is not None and facts.python is not None:
        check_wheelhouse(options.wheelhouse, facts.python, facts.arch)
    if spec.runtime_lib is None:
        spec = replace(spec, runtime_lib=default_runtime_lib(facts.arch))
    backend, backend_note = None, "not needed: no NVIDIA driver on the device (no libcuda.so.1, not a Jetson)"
    if facts.nvidia:
        backend, backend_note = cuda_backend_for(facts.arch, options.wheelhouse)
    spec = replace(spec, cuda_backend_lib=backend)
    spec, system_note = choose_sidecar(facts, spec, options)
    steps = plan_install(facts, spec, write_install_files(spec, work_dir))
    if options.pull is None:
        return InstallPlan(facts, spec, steps, cuda_backend=backend_note, system_python=system_note)
    files = write_pull_files(spec, options.pull, work_dir)
    pull = plan_pull(parse_pull_probe(stdout), spec, options.pull, files)
    return InstallPlan(facts, spec, steps + pull, files, cuda_backend=backend_note, system_python=system_note)


def execute_plan(
    transport: Transport, device: Device, plan: InstallPlan, step: Callable[[str], None] = lambda s: None
) -> InstallResult:
    """Run the plan's steps in order (root steps through `sudo -n` for a non-root login), then check health."""
    spec = plan.spec
    sudo = ["sudo", "-n"] if plan.facts.uid != 0 else []
    for s in plan.steps:
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
    return InstallResult(device.name, [s.name for s in plan.steps], plan.facts, agent, opencv, health)


def install_agent(
    inv: Inventory,
    name: str,
    options: InstallOptions,
    *,
    dry_run: bool = False,
    step: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Bootstrap the agent on a device (user, venv, agent, TVM runtime, unit), then point the inventory at it."""
    dev = inv.get(name)
    with tempfile.TemporaryDirectory() as tmp:
        step("agent wheel")
        spec = install_spec(dev, options, agent_wheels(Path(tmp), options.wheelhouse))
        step("connect")
        with connected(dev, inv.known_hosts) as t:
            plan = plan_on(t, spec, options, Path(tmp))
            if dry_run:
                return {
                    "device": name,
                    "dry_run": True,
                    "steps": [s.name for s in plan.steps],
                    "facts": plan.facts.__dict__,
                    "cuda_backend": plan.cuda_backend,
                    "system_python": plan.system_python,
                }
            broker_user = None
            if options.pull and plan.pull_files and "install broker password" in [s.name for s in plan.steps]:
                # the broker learns the user before the device has its password: the device's first connect works
                kept = record_broker_user(name, plan.pull_files.password, options.pull.broker_passwd)
                added = str(options.pull.broker_passwd) if options.pull.broker_passwd else None
                broker_user = {"user": name, "password_file": str(kept), "added_to": added}
            result = execute_plan(t, dev, plan, step)
    if dev.agent_command != result.agent_command:
        inv.add(dev.model_copy(update={"agent_command": result.agent_command}), replace=True)
    return {
        "device": name,
        "changed": result.steps,
        "agent_command": result.agent_command,
        "opencv": result.opencv,
        "cuda_backend": plan.cuda_backend,
        "system_python": plan.system_python,
        "healthy": bool(result.health.get("ok") and result.health.get("initialised")),
        "facts": result.facts.__dict__,
        "broker_user": broker_user,
    }


def _run(transport: Transport, argv: list[str], what: str) -> str:
    r = transport.run(argv, timeout=900)
    if r.exit_code != 0:
        detail = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise DeviceError(f"install step '{what}' failed (exit {r.exit_code}): {detail}", hint=shlex.join(argv))
    return r.stdout


def _json_tail(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    data: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return data
