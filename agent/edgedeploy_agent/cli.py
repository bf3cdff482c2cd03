"""`edgedeploy-agent`: the device-side commands. The host calls them over SSH with --json.

Every command prints one JSON object with --json ({"ok": true, ...} or {"ok": false, "error": {...}})
and exits non-zero on failure; without --json it prints a short human line.
"""

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Union

from pydantic import ValidationError

from . import __version__, tvm_without_torch
from .agentlog import DEFAULT_LINES, MAX_LINES, stamp_stderr
from .blobs import BlobSource, BlobStore
from .bundle import SCHEMA_VERSION, verify_bundle
from .config import AgentConfig, config_error
from .durable import write_atomic
from .errors import AgentError, StateError
from .facts import Facts
from .heartbeat import present_health
from .lifecycle import (
    FINISH_HEALTH_TIMEOUT_S,
    BundleSource,
    Deployment,
    describe_release,
    finish_interrupted,
    interrupted,
    recover,
    rollback,
    watch_for_interruptions,
)
from .names import DEFAULT_SLOT, SLOT_NAME_RULE
from .service import HealthObjectives, make_service, read_health
from .store import DeviceStore, migrate_layout
from .trust import TrustStore

DEFAULT_ROOT = "/var/lib/edgedeploy"


def _facts(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    return Facts.model_validate(_gather_facts(store, args)).model_dump(mode="json")


def _gather_facts(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "agent_version": __version__,
        "bundle_schema": SCHEMA_VERSION,
        "python": platform.python_version(),
        "arch": platform.machine(),
        "root": str(store.root),
        "initialised": store.initialised,
        "uid": os.getuid(),
    }
    probe = store.root if store.root.exists() else store.root.parent
    facts["free_bytes"] = shutil.disk_usage(probe).free if probe.exists() else None
    if store.initialised:  # read only: facts never recover a transition nor verify an upload
        facts["busy"] = store.busy()
        state = store.state()
        cfg = store.config()
        # the model slot asked about (`--model`, default `default`) at the top, as before slots; every slot under
        # `models`
        facts.update(
            service=cfg.service,
            slot=store.slot,
            **_slot_facts(store),
            sources=cfg.sources,
            history=state["history"][-5:],
            profile=cfg.profile,
            trusted_keys=sorted(TrustStore(store.root).keys()),
            serial=(state.get("serial") or {}).get("serial"),
            models={slot: _slot_facts(store.for_slot(slot)) for slot in store.slots()},
        )
        if args.blobs:  # the host's one round trip before an upload: facts plus what is missing
            facts["blobs"] = _missing(store, args.blobs)
    return facts


def _slot_facts(store: DeviceStore) -> dict[str, Any]:
    state = store.state()
    return {
        "source": store.config().source,
        "running": make_service(store).is_running(),
        "health": present_health(store.run_dir, read_health(store)),  # `dead` when its writer is gone
        "current": describe_release(store, state["current"]),
        "previous": state["previous"],
        "pending": state["pending"],  # a transition in flight, or one a crash left for `recover`
    }


def _stored_config(store: DeviceStore) -> dict[str, Any]:
    if not store.initialised:
        return {}
    try:
        data = json.loads(store.config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _init(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    slot_source = _slot_source(store, args)  # `init --model NAME --source URI`
    changes = {
        k: v
        for k, v in {
            "device_name": args.device_name,
            "service": args.service,
            "tvm_runtime_lib": args.tvm_runtime_lib,
            "cuda_backend": args.cuda_backend,
            "cuda_backend_lib": args.cuda_backend_lib,
            "system_python": args.system_python,
            "report_interval_s": args.report_interval,
            "metrics_port": args.metrics_port,
            "profile": args.profile,
            "keep_releases": args.keep_releases,
            "health_frames": args.health_frames,
            "frame_spin_ms": args.frame_spin_ms,
        }.items()
        if v is not None
    }
    if slot_source is None:
        changes.update(_source_changes(args))
    with store.config_lock():  # agent.json's read-modify-write, one at a time (as update_config)
        base = _stored_config(store)  # as stored, unvalidated: `init --device-name` repairs a name now refused
        try:
            cfg = AgentConfig.model_validate({**base, **changes})
        except ValidationError as e:
            raise StateError(f"init: {config_error(e)}") from None
        store.init(cfg)
    if slot_source is not None:
        store.set_source(slot_source or None)
    BlobStore(store.root).init()
    return {"root": str(store.root), "config": store.device_config().model_dump(mode="json")}


def _slot_source(store: DeviceStore, args: argparse.Namespace) -> Optional[str]:
    """`--source` of a model slot besides `default`: its one source ('' clears it). None for the default slot,
    whose sources (one or several, batched) are `_source_changes`."""
    if store.slot == DEFAULT_SLOT or args.source is None:
        return None
    uris = [u for u in args.source if u]
    if len(uris) > 1:
        raise StateError(
            f"model {store.slot}: a model besides `default` serves one source (several are batched into `default`)"
        )
    return uris[0] if uris else ""


def _source_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The config changes of `--source` (one: `source`; several: `sources`; either replaces the other; '' clears)
    and `--max-batch-wait-ms`."""
    changes: dict[str, Any] = {}
    if args.source is not None:
        uris = [u for u in args.source if u]
        changes.update(source=uris[0] if len(uris) == 1 else None, sources=uris if len(uris) > 1 else [])
    if args.max_batch_wait_ms is not None:
        changes["max_batch_wait_ms"] = args.max_batch_wait_ms
    return changes


def _deploy(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    store.require_initialised()
    slot_source = _slot_source(store, args)
    if slot_source is not None:
        store.set_source(slot_source or None)
    sources = _source_changes(args) if slot_source is None else {}
    if sources:
        try:
            store.update_config(**sources)
        except ValidationError as e:
            raise StateError(f"deploy: {config_error(e)}") from None
    cfg = store.config()
    timeout = args.timeout or cfg.health_timeout_s
    source: Union[Path, BundleSource]
    if args.manifest_blob:
        source = BlobSource(store, args.manifest_blob, args.signature_blob)
    elif args.bundle:
        source = Path(args.bundle)
    else:
        raise StateError("deploy needs a bundle file or --manifest-blob")
    objectives = HealthObjectives(args.min_inferences, args.max_p95_ms, args.min_fps)
    deployment = Deployment(store, make_service(store))
    with store.exclusive("deploy"):
        return deployment.deploy(
            source, timeout=timeout, force=args.force, objectives=objectives, build_timeout=args.build_timeout
        )


def _recover(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    """Finish a transition a crash interrupted (every deploy and rollback does this first), in the slot that
    `--model` names, else in every slot (the default slot's answer at the top, the others' under `models`)."""
    store.require_slot()
    if args.model:
        return _recover_slot(store, args)
    answers = {slot: _recover_slot(store.for_slot(slot), args) for slot in store.slots()}
    answer = answers.pop(DEFAULT_SLOT)
    return {**answer, "models": answers} if answers else answer


def _recover_slot(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    pending = store.state()["pending"]
    if args.finish and interrupted(store) is None:  # the finisher's timer, every minute: nothing cut off, nothing to do
        return {"recovered": None, "finished": None, "current": store.state()["current"]}
    # only a transition nobody is running is recovered: never undo a deploy in flight
    with store.exclusive("recovery"):
        if args.finish:  # the device on its own (the service at start, the watch): health check, commit or back
            done = finish_interrupted(store, make_service(store), args.timeout or FINISH_HEALTH_TIMEOUT_S)
            return {"recovered": pending, "finished": done, "current": store.state()["current"]}
        current = recover(store, make_service(store))
    return {"recovered": pending, "current": current if pending else store.state()["current"]}


def _missing(store: DeviceStore, shas: list[str]) -> dict[str, Any]:
    """Which of these blobs the device lacks, and free space. Read only: a finished upload counts as there
    (the deploy verifies it: a corrupt one is refused with "push again")."""
    blobs = BlobStore(store.root)
    missing = [sha for sha in shas if not blobs.present(sha)]
    return {
        "missing": missing,
        "partial": {sha: blobs.partial_bytes(sha) for sha in missing if blobs.partial_bytes(sha)},
        "free_bytes": shutil.disk_usage(store.root).free,
    }


def _blobs(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    store.require_initialised()
    return _missing(store, args.sha256)


def _trust(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    store.require_initialised()
    trust = TrustStore(store.root)
    if args.set is not None:
        trust.replace(args.set)
    return {"trusted_keys": sorted(trust.keys())}


def _rollback(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    store.require_slot()
    with store.exclusive("rollback"):
        return rollback(store, make_service(store), args.timeout or store.config().health_timeout_s)


def _verify(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    m = verify_bundle(Path(args.bundle))
    return {"bundle_id": m.bundle_id, "release": m.release_name, "artifacts": len(m.artifacts)}


def _reports(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    store.require_initialised()
    from .spool import ack_reports, pending_reports  # lazily: only the commands that need them load it

    if args.ack:
        return {"acked": ack_reports(store, args.ack)}
    return {"reports": [{"file": f, "report": r} for f, r in pending_reports(store)[: args.limit]]}


def _watch_config(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    """Where the device pulls from (broker, read-only registry) and which rollout keys it pins."""
    store.require_initialised()
    from .desired import rollout_trust
    from .watch import WatchConfig

    fields = {
        "broker": args.broker,
        "registry_url": args.registry,
        "username": args.username,
        "password_file": args.password_file,
        "ca_file": args.ca_file,
        "poll_s": args.poll,
    }
    try:
        cfg = WatchConfig.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise StateError(f"watch-config: {where}: {err['msg']} (got {err.get('input')!r})") from None
    trust = rollout_trust(store.root)
    if args.rollout_key:
        trust.replace(args.rollout_key)
    write_atomic(WatchConfig.path(store.root), cfg.model_dump_json(indent=1))
    return {"config": cfg.model_dump(mode="json"), "rollout_keys": sorted(trust.keys())}


def _install_bundle(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    """A bundle brought on a USB stick: the same verify, trust, activate, health, rollback path as a push."""
    bundle = Path(args.bundle).absolute()
    if not bundle.is_file():
        raise StateError(f"bundle file {bundle} does not exist", hint="check the path (is the USB stick mounted?)")
    store.require_initialised()
    if os.geteuid() == 0 and store.root.stat().st_uid != 0:
        raise StateError(
            f"refusing to install as root into {store.root}, which belongs to uid {store.root.stat().st_uid}: "
            "root-owned files would lock the agent out of its own releases",
            hint="run it as the agent's user, e.g. sudo -u edgedeploy edgedeploy-agent install-bundle FILE",
        )
    return _deploy(store, args)


def _selftest(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    from .selftest import run_selftest

    store.require_slot()
    return run_selftest(store, camera_seconds=args.camera_seconds)


def _stop(store: DeviceStore, args: argparse.Namespace) -> dict[str, Any]:
    store.require_slot()
    make_service(store).stop()
    return {"stopped": True}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgedeploy-agent", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument(
        "--root",
        default=os.environ.get("EDGEDEPLOY_AGENT_ROOT", DEFAULT_ROOT),
        help=f"agent state folder (default {DEFAULT_ROOT})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    sub = p.add_subparsers(dest="command", required=True)
    p.set_defaults(model=None)

    def model_arg(s: argparse.ArgumentParser, what: str = "the model slot") -> None:
        s.add_argument("--model", help=f"{what} (default: {DEFAULT_SLOT}; {SLOT_NAME_RULE})")

    s = sub.add_parser("init", help="create the agent folders and config (idempotent)")
    s.add_argument("--device-name")
    s.add_argument("--service", choices=["process", "systemd"])
    s.add_argument(
        "--source",
        action="append",
        help="frame source URI, e.g. file:/data/clip.mp4; repeat it for several sources in one agent ('' clears)",
    )
    s.add_argument(
        "--max-batch-wait-ms",
        type=float,
        help="several sources: how long a batch waits for the other sources' frames (default 10)",
    )
    s.add_argument(
        "--frame-spin-ms",
        type=float,
        help="one source: how long the loop polls for the next frame before it sleeps (default 0: at once; e.g. 2)",
    )
    s.add_argument("--tvm-runtime-lib", help="path of libtvm_runtime.so")
    s.add_argument("--cuda-backend-lib", help="path of libedgedeploy_cuda.so, edgedeploy's CUDA backend")
    s.add_argument(
        "--cuda-backend",
        choices=("auto", "edgedeploy", "tvm"),
        help="GPU bundles: edgedeploy's CUDA backend (CUDA 11.4+), the TVM wheel's (CUDA 13+), or auto",
    )
    s.add_argument(
        "--system-python",
        help="JetPack's Python 3.8 (or a venv made from it): TensorRT and GStreamer capture run there when this "
        "Python lacks them ('' clears it)",
    )
    s.add_argument("--report-interval", type=float)
    s.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    s.add_argument("--profile", help="device profile; bundles for another profile are refused")
    s.add_argument("--keep-releases", type=int, help="releases kept on the device (current + previous)")
    s.add_argument("--health-frames", type=int, help="real frames a deploy must serve to be healthy (default 3)")
    model_arg(s, "with --source: set this model slot's source")
    s.set_defaults(fn=_init)

    s = sub.add_parser("facts", help="what the host needs to plan a deploy (changes nothing)")
    s.add_argument("--blobs", nargs="+", metavar="SHA256", help="also say which of these blobs are missing")
    model_arg(s, "the model slot described at the top (all are under `models`)")
    s.set_defaults(fn=_facts)

    s = sub.add_parser("deploy", help="verify, unpack, activate, restart, health-check; roll back on failure")
    s.add_argument("bundle", nargs="?", help="an uploaded .edb file (or use --manifest-blob)")
    s.add_argument("--manifest-blob", help="sha256 of the manifest blob of a bundle pushed as blobs")
    s.add_argument("--signature-blob", help="sha256 of its manifest.sig blob")
    s.add_argument("--min-inferences", type=int, default=0, help="inferences that must succeed after ready")
    s.add_argument("--max-p95-ms", type=float, help="health objective: inference p95 latency")
    s.add_argument("--min-fps", type=float, help="health objective: frames per second")
    s.add_argument("--timeout", type=float, help="health-check timeout in seconds")
    s.add_argument(
        "--source", action="append", help="set the frame source URI before restarting (repeat it for several)"
    )
    s.add_argument("--max-batch-wait-ms", type=float, help="several sources: set the batch wait before restarting")
    s.add_argument("--force", action="store_true", help="redeploy even if this bundle is already running")
    s.add_argument(
        "--build-timeout", type=float, help="while a TensorRT engine is built at activation, wait up to this many s"
    )
    model_arg(s, "the model slot to deploy into (created by its first deploy)")
    s.set_defaults(fn=_deploy)

    s = sub.add_parser(
        "install-bundle", help="deploy a bundle file from local media (USB): the same checks and records as a push"
    )
    s.add_argument("bundle", help="the .edb file, e.g. /media/usb/model.edb (left where it is)")
    s.add_argument("--timeout", type=float, help="health-check timeout in seconds")
    s.add_argument("--min-inferences", type=int, default=0, help="inferences that must succeed after ready")
    s.add_argument("--max-p95-ms", type=float, help="health objective: inference p95 latency")
    s.add_argument("--min-fps", type=float, help="health objective: frames per second")
    s.add_argument("--force", action="store_true", help="redeploy even if this bundle is already running")
    s.add_argument("--build-timeout", type=float, help="wait this long for a TensorRT engine build")
    model_arg(s, "the model slot to install into")
    s.set_defaults(fn=_install_bundle, source=None, max_batch_wait_ms=None, manifest_blob=None, signature_blob=None)

    s = sub.add_parser("selftest", help="check this device: runtime, GPU, camera, sensors, disk, keys, service")
    s.add_argument("--camera-seconds", type=float, default=5.0, help="how long to wait for camera frames")
    model_arg(s, "the model slot whose release, health, source and service to check")
    s.set_defaults(fn=_selftest)

    s = sub.add_parser("logs", help="print the agent's log (journal in systemd mode), optionally followed")
    s.add_argument("--lines", type=int, default=DEFAULT_LINES, help=f"last N lines (at most {MAX_LINES})")
    s.add_argument("--since", help="only lines from this long ago on: 90s, 30m, 1h, 2d")
    s.add_argument("--follow", action="store_true", help="keep printing new lines until interrupted")
    model_arg(s, "the model slot whose agent's log to print")
    s.set_defaults(fn=None)

    s = sub.add_parser("blobs", help="which of these sha256 blobs are missing on the device")
    s.add_argument("sha256", nargs="*")
    s.set_defaults(fn=_blobs)

    s = sub.add_parser("trust", help="list the pinned bundle-signing keys, or replace them with --set")
    s.add_argument("--set", nargs="+", metavar="KEY", help="public keys (ed25519:<base64>) to pin")
    s.set_defaults(fn=_trust)

    s = sub.add_parser("recover", help="finish a deploy or rollback a crash interrupted (back to the last commit)")
    s.add_argument(
        "--finish",
        action="store_true",
        help="a deploy cut off in activation or health check: run its health check, commit or roll back",
    )
    s.add_argument("--timeout", type=float, help=f"health check seconds (default {FINISH_HEALTH_TIMEOUT_S:g})")
    s.add_argument("--model", help="only this model slot (default: every slot)")
    s.set_defaults(fn=_recover)

    s = sub.add_parser("rollback", help="go back to the previous release")
    s.add_argument("--timeout", type=float)
    model_arg(s)
    s.set_defaults(fn=_rollback)

    s = sub.add_parser("verify", help="check a bundle file's manifest and every artifact hash")
    s.add_argument("bundle")
    s.set_defaults(fn=_verify)

    s = sub.add_parser("reports", help="print pending reports, or acknowledge pulled ones")
    s.add_argument("--ack", nargs="*", help="spool file names the host has stored safely")
    s.add_argument("--limit", type=int, default=1000)
    s.set_defaults(fn=_reports)

    s = sub.add_parser("stop", help="stop the running agent")
    model_arg(s)
    s.set_defaults(fn=_stop)

    s = sub.add_parser("watch-config", help="configure pull rollouts: MQTT broker, registry, rollout keys")
    s.add_argument("--broker", required=True, help="MQTT broker HOST:PORT")
    s.add_argument("--registry", required=True, help="read-only registry endpoint, e.g. http://cache:5000")
    s.add_argument("--username", help="broker user (default: the device name)")
    s.add_argument("--password-file", help="file holding the broker password (mode 0600)")
    s.add_argument("--ca-file", help="fleet CA certificate: connect to the broker with TLS")
    s.add_argument("--rollout-key", nargs="+", help="rollout public keys (ed25519:<base64>) to pin")
    s.add_argument("--poll", type=float, help="seconds between retries of the last desired state")
    s.set_defaults(fn=_watch_config)

    s = sub.add_parser("watch", help="follow this device's desired state over MQTT (a service of its own)")
    s.add_argument("--max-seconds", type=float, help="stop after this long (tests)")
    s.set_defaults(fn=None)

    s = sub.add_parser("run", help="the service itself: load the current bundle and run the source")
    s.add_argument("--max-frames", type=int)
    model_arg(s, "the model slot this agent serves")
    s.set_defaults(fn=None)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    tvm_without_torch.install()  # on a development host: the runtime's tvm_ffi would import PyTorch
    args = _parser().parse_args(argv)
    try:
        store = DeviceStore(Path(args.root).expanduser().absolute(), args.model or DEFAULT_SLOT)
        if store.initialised:  # a root from before model slots moves into models/default first (store.py)
            migrate_layout(store.root)
    except AgentError as e:
        return _fail(args.json, e)
    if args.command == "logs":
        return _logs(store, args)
    if args.command in ("run", "watch"):
        if args.command == "run":
            stamp_stderr()
        try:
            store.require_initialised()
            if args.command == "watch":
                from .watch import run_watch

                return run_watch(store, max_seconds=args.max_seconds)
        except AgentError as e:
            print(f"edgedeploy-agent: {e.message}", file=sys.stderr)
            return e.exit_code
        from .loop import run_agent

        # the service finishes a transition a lost connection cut off, at start and whenever one is left
        watch_for_interruptions(store)
        return run_agent(store, max_frames=args.max_frames)
    fn: Callable[[DeviceStore, argparse.Namespace], dict[str, Any]] = args.fn
    try:
        result = fn(store, args)
    except AgentError as e:
        return _fail(args.json, e)
    except OSError as e:
        _emit(args.json, {"ok": False, "error": {"code": "os-error", "message": str(e), "hint": None}}, f"error: {e}")
        return 1
    if args.command == "selftest":
        from .selftest import FAILED, checklist_text

        _emit(args.json, {"ok": True, **result}, checklist_text(result))
        return 1 if result["overall"] == FAILED else 0
    if args.command == "install-bundle":
        was = result.get("previous") or "no bundle"
        text = f"{result['outcome']}: {result['release']} (was {was[0] if isinstance(was, list) else was})"
        _emit(args.json, {"ok": True, **result}, text)
        return 0
    _emit(args.json, {"ok": True, **result}, json.dumps(result, indent=1, default=str))
    return 0


def _logs(store: DeviceStore, args: argparse.Namespace) -> int:
    """Log lines go to stdout as they are; an error is one line on stderr (JSON with --json)."""
    from .agentlog import parse_since, print_logs

    err: AgentError
    try:
        since = parse_since(args.since) if args.since else None
        store.require_slot()
        cfg = store.config()
        unit = cfg.unit if cfg.service == "systemd" else None
        return print_logs(store.log_path, unit, args.lines, since, args.follow, sys.stdout.buffer)
    except ValueError as e:
        err = StateError(str(e))
    except AgentError as e:
        err = e
    except BrokenPipeError:  # the reader went away: nothing left to tell it
        return 0
    text = f"error: {err.message}" + (f"\nhint: {err.hint}" if err.hint else "")
    print(json.dumps({"ok": False, "error": err.to_dict()}) if args.json else text, file=sys.stderr)
    return err.exit_code


def _fail(as_json: bool, e: AgentError) -> int:
    _emit(as_json, {"ok": False, "error": e.to_dict()}, f"error: {e.message}" + (f"\nhint: {e.hint}" if e.hint else ""))
    return e.exit_code


def _emit(as_json: bool, data: dict[str, Any], text: str) -> None:
    if as_json:
        print(json.dumps(data, default=str))
    else:
        print(text, file=sys.stderr if not data.get("ok") else sys.stdout)
