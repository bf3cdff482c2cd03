"""The device's on-disk store: model slots, each with its releases, atomic `current` link and state; spool.

ROOT/agent.json           configuration (agent.json's `models` configures slots besides `default`)
ROOT/incoming/            uploads land here (*.part while in flight)
ROOT/spool/               reports waiting for the host (spool/sent/ once acknowledged), of every slot
ROOT/run/                 the restart request of the systemd path unit
ROOT/models/<slot>/       one deployed model (`default` unless `--model NAME` says otherwise):
    state.json            current / previous releases, the pending transition, history
    releases/<name>/      unpacked, verified bundles (never modified after the rename)
    current -> releases/<name>   swapped by rename(2): readers see old or new, never neither
    run/                  pid file, health.json, heartbeat and report counter of the slot's running agent

A root from before slots (releases/, current, state.json and run/'s files at the top) is moved into
models/default by `migrate_layout` before any command reads it (see there).
"""

import datetime as _dt
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Optional

from pydantic import ValidationError

from .bundle import MANIFEST_NAME, Manifest, extract_bundle, read_manifest, sha256_file, verify_bundle
from .config import CONFIG_HINT, AgentConfig, ModelSlotConfig, config_error
from .durable import atomic_folder, fsync_dir, write_atomic, write_json_atomic
from .errors import BundleError, InsufficientSpace, StateError
from .names import DEFAULT_SLOT, SLOT_NAME_RULE, is_slot_name

SPACE_MARGIN_BYTES = 16 << 20
HISTORY_LENGTH = 50


def check_free(folder: Path, needed: int) -> None:
    """`needed` bytes and SPACE_MARGIN_BYTES must fit in the free space under `folder` (InsufficientSpace)."""
    free = shutil.disk_usage(folder).free
    if free < needed + SPACE_MARGIN_BYTES:
        raise InsufficientSpace(
            f"device has {free // (1 << 20)} MiB free under {folder}, "
            f"needs {(needed + SPACE_MARGIN_BYTES) // (1 << 20)} MiB",
            hint="free space on the device or remove old releases",
        )


def utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def check_slot(name: str) -> str:
    """A model slot's name, or StateError: it becomes a folder name (see names.py)."""
    if not is_slot_name(name):
        raise StateError(f"{name[:40]!r} is not a model name ({SLOT_NAME_RULE})")
    return name


class DeviceStore:
    """One model slot of a device's store (`slot`); the configuration, uploads, spool and logs are the device's."""

    def __init__(self, root: Path, slot: str = DEFAULT_SLOT) -> None:
        self.root, self.slot = root, check_slot(slot)
        self.incoming = root / "incoming"
        self.spool = root / "spool"
        self.logs = root / "logs"
        self.config_path = root / "agent.json"
        self.slot_dir = root / "models" / slot
        self.releases = self.slot_dir / "releases"
        self.run_dir = self.slot_dir / "run"
        self.current_link = self.slot_dir / "current"
        self.state_path = self.slot_dir / "state.json"
        # the default slot keeps the log it always had
        self.log_path = self.logs / ("agent.log" if slot == DEFAULT_SLOT else f"agent-{slot}.log")
        self._blob_lock: Optional[BinaryIO] = None  # held shared while this store's `exclusive` runs

    def for_slot(self, slot: str) -> "DeviceStore":
        return DeviceStore(self.root, slot)

    # --- setup ------------------------------------------------------------------------------
    def init(self, config: AgentConfig) -> None:
        for d in (self.root, self.incoming, self.spool, self.spool / "sent", self.root / "run", self.logs):
            d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.config_path, config.model_dump(mode="json"))
        migrate_layout(self.root)
        self.ensure_slot()

    def ensure_slot(self) -> None:
        """Create this slot's folders and empty state (a first push to a new model name does)."""
        for d in (self.releases, self.run_dir):
            make_dirs(d)
        if not self.state_path.exists():
            write_json_atomic(self.state_path, self._empty_state())

    def slots(self) -> list[str]:
        """The device's model slots: `default` first, then every other one deployed to or configured."""
        found = {d.name for d in (self.root / "models").glob("*") if d.is_dir() and is_slot_name(d.name)}
        if self.initialised:
            found.update(self.device_config().models)
        return [DEFAULT_SLOT, *sorted(found - {DEFAULT_SLOT})]

    def require_slot(self) -> None:
        """Commands that read or roll back a slot need one that exists (a push creates it)."""
        self.require_initialised()
        if self.slot != DEFAULT_SLOT and self.slot not in self.slots():
            raise StateError(
                f"this device has no model {self.slot!r} (models: {', '.join(self.slots())})",
                hint="push a bundle with --model NAME to create it",
            )

    @property
    def initialised(self) -> bool:
        return self.config_path.is_file()

    def require_initialised(self) -> None:
        if not self.initialised:
            raise StateError(
                f"{self.root} is not an initialised agent root",
                hint="run `edgedeploy devices enroll` (or `edgedeploy-agent init --root ...`) first",
            )

    def device_config(self) -> AgentConfig:
        """agent.json as written, for every slot."""
        self.require_initialised()
        try:
            return AgentConfig.model_validate_json(self.config_path.read_text(encoding="utf-8"))
        except ValidationError as e:
            raise StateError(f"{self.config_path} is invalid: {config_error(e)}", hint=CONFIG_HINT) from None

    def config(self) -> AgentConfig:
        """The configuration this slot's agent runs with (AgentConfig.for_slot)."""
        return self.device_config().for_slot(self.slot)

    def update_config(self, **changes: Any) -> AgentConfig:
        """Change agent.json's device-wide fields (the default slot's sources, the batch wait, every slot's
        `models`), validated; one change at a time on the device (`config_lock`), so two slots' changes at once
        (two pushes setting their sources) both land."""
        with self.config_lock():
            cfg = AgentConfig.model_validate({**self.device_config().model_dump(), **changes})
            write_json_atomic(self.config_path, cfg.model_dump(mode="json"))
        return cfg

    @contextmanager
    def config_lock(self) -> Iterator[None]:
        """The device-wide lock of agent.json's read-modify-write: waited for (a change takes milliseconds). Not the
        transitions' lock: a config change never waits for a slot's deploy (an engine build takes minutes)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with _locked(self.root / ".config.lock", fcntl.LOCK_EX):
            yield

    def set_source(self, source: Optional[str]) -> None:
        """This slot's one frame source (a slot besides `default` keeps its own in agent.json's `models`)."""
        if self.slot == DEFAULT_SLOT:
            self.update_config(source=source, sources=[])
            return
        models = self.device_config().models
        own = models.get(self.slot) or ModelSlotConfig()
        self.update_config(models={**models, self.slot: own.model_copy(update={"source": source})})

    @contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """One deploy, rollback or recovery at a time in a model slot (two hosts, or two rollouts, may collide);
        slots do not wait for each other (one slot's TensorRT engine build takes minutes). The device lock
        (ROOT/.lock) is held shared meanwhile: what changes the whole device (`device_exclusive`: the move of a
        root from before slots) waits for every slot, and an agent from before per-slot locks, which takes the
        device lock exclusively for its deploy, and this one refuse each other."""
        make_dirs(self.slot_dir)
        of = "" if self.slot == DEFAULT_SLOT else f" (model {self.slot})"
        busy = StateError(
            f"another deploy or rollback is running on this device{of}; {what} refused",
            hint="wait for it to finish, then try again",
        )
        with _locked(self.root / ".lock", fcntl.LOCK_SH, busy), _locked(self.slot_dir / ".lock", fcntl.LOCK_EX, busy):
            with self._blobs_in_use():
                yield

    @contextmanager
    def _blobs_in_use(self) -> Iterator[None]:
        """The blob lock (ROOT/.blobs.lock), shared for a transition: the blobs it verifies and links into its
        release have one link (the store's) until then, which is what removal looks for (`sole_blob_user`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(os.open(self.root / ".blobs.lock", os.O_RDONLY | os.O_CREAT, 0o640), "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # waited for: a removal holds it exclusively for milliseconds
            self._blob_lock = f
            try:
                yield
            finally:
                self._blob_lock = None
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    @contextmanager
    def sole_blob_user(self) -> Iterator[bool]:
        """Whether blobs may be removed now: True while no other transition (of another slot) uses blobs, and
        none starts until the block ends; False while one does (its verified, not yet linked blobs look unused:
        they are left for a later collection). Inside this store's `exclusive`, its shared blob lock is converted;
        outside one (a caller holding no lock), it is taken shared first, as a transition does. Never waits for a
        transition."""
        held = self._blob_lock
        if held is None:
            with self._blobs_in_use(), self.sole_blob_user() as sole:
                yield sole
            return
        try:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            sole = True
        except BlockingIOError:
            sole = False  # a failed conversion may have given up the shared lock: taken again below
        try:
            yield sole
        finally:
            fcntl.flock(held.fileno(), fcntl.LOCK_SH)

    @contextmanager
    def device_exclusive(self, what: str) -> Iterator[None]:
        """The whole device, while no slot's transition runs (refused while one does)."""
        self.root.mkdir(parents=True, exist_ok=True)
        busy = StateError(f"a deploy or rollback is running on this device; {what} refused", hint="try again")
        with _locked(self.root / ".lock", fcntl.LOCK_EX, busy):
            yield

    def busy(self) -> bool:
        """Whether a deploy, rollback or recovery of this slot holds `exclusive` now, or something the whole device
        (probed with shared locks)."""
        for lock in (self.slot_dir / ".lock", self.root / ".lock"):
            if not lock.exists():
                continue
            with open(lock) as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False

    # --- state ------------------------------------------------------------------------------
    @staticmethod
    def _empty_state() -> dict[str, Any]:
        return {"current": None, "previous": [], "pending": None, "history": []}

    def state(self) -> dict[str, Any]:
        self.require_initialised()
        if not self.state_path.exists():  # a slot nothing was pushed to yet
            return self._empty_state()
        try:
            data: dict[str, Any] = json.loads(self.state_path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise StateError(f"{self.state_path} is corrupt: {e}") from None
        return data

    def save_state(self, state: dict[str, Any]) -> None:
        self.ensure_slot()
        state["history"] = state.get("history", [])[-HISTORY_LENGTH:]
        write_json_atomic(self.state_path, state)

    def record(self, state: dict[str, Any], event: str, release: Optional[str], detail: str = "") -> None:
        state.setdefault("history", []).append({"time": utcnow(), "event": event, "release": release, "detail": detail})

    # --- releases ---------------------------------------------------------------------------
    def current(self) -> Optional[str]:
        try:
            return Path(os.readlink(self.current_link)).name
        except FileNotFoundError:
            return None

    def release_dir(self, name: str) -> Path:
        return self.releases / name

    def check_space(self, needed: int) -> None:
        check_free(self.root, needed)

    def stage(self, bundle_file: Path) -> Manifest:
        """Verify and unpack a bundle into releases/<name>; reuse an identical earlier unpack.

        The uploaded file is always verified in full, even when its release is already unpacked:
        a tampered or truncated upload is refused either way.
        """
        manifest = read_manifest(bundle_file)
        final = self.release_dir(manifest.release_name)
        if final.is_dir():
            verify_bundle(bundle_file)
            try:
                self.load_release(manifest.release_name)
                return manifest
            except BundleError:
                shutil.rmtree(final)
        self.check_space(sum(a.size for a in manifest.artifacts))
        self.ensure_slot()
        with atomic_folder(final) as tmp:  # releases/.tmp-<release> until it is whole
            extract_bundle(bundle_file, tmp)
        return manifest

    def remove_staging_leftovers(self) -> list[str]:
        """Remove the releases/.tmp-* folders of a stage that was killed; only under `exclusive`."""
        leftovers = sorted(d.name for d in self.releases.glob(".tmp-*")) if self.releases.is_dir() else []
        for name in leftovers:
            shutil.rmtree(self.releases / name, ignore_errors=True)
        return leftovers

    def load_release(self, name: str) -> Manifest:
        """Read a release's manifest and re-check its artifacts' hashes before any byte is used."""
        d = self.release_dir(name)
        try:
            manifest = Manifest.model_validate_json((d / MANIFEST_NAME).read_bytes())
        except (OSError, ValueError) as e:
            raise BundleError(f"release {name} is unreadable: {e}") from None
        for a in manifest.artifacts:
            p = d / a.path
            if not p.is_file() or p.stat().st_size != a.size or sha256_file(p) != a.sha256:
                raise BundleError(f"release {name}: {a.path} does not match its manifest (disk corruption?)")
        return manifest

    def activate(self, name: Optional[str]) -> None:
        """Point `current` at releases/<name> atomically (None removes the link)."""
        if name is None:
            self.current_link.unlink(missing_ok=True)
        else:
            point_link(self.current_link, os.path.join("releases", name))
        fsync_dir(self.slot_dir)

    def prune(self, keep: list[str], count: int) -> list[str]:
        """Remove releases beyond the newest `count` of `keep` (current first, then previous)."""
        wanted = set(keep[:count])
        removed = []
        for d in self.releases.iterdir() if self.releases.is_dir() else []:
            if d.is_dir() and d.name not in wanted:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d.name)
        return sorted(removed)


def make_dirs(path: Path) -> None:
    """mkdir -p `path`, each folder it makes with its parent folder's group write bit (and setgid). In systemd mode
    the agent root is the service user's, group-writable and setgid (`agent install`), so that the deploying login
    in the group writes there too; a folder made later (a new model slot's, by a push over SSH or by the watch
    service) would otherwise get its maker's umask (a login's 022, the units' UMask=0027) and lock the other out."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another process
        parent = os.stat(d.parent).st_mode
        if parent & stat.S_IWGRP:
            os.chmod(d, stat.S_IMODE(os.stat(d).st_mode) | stat.S_IRWXG | (parent & stat.S_ISGID))


@contextmanager
def _locked(path: Path, how: int, busy: Optional[StateError] = None) -> Iterator[None]:
    """flock(2) `how` on `path` for the block: refused with `busy` when it is held against it, else (busy None)
    waited for. The file is opened read-only: flock needs no write access, so the service user and a deploying
    login in its group share the lock whoever created it (the unit's UMask=0027 leaves the group no write access)."""
    with open(os.open(path, os.O_RDONLY | os.O_CREAT, 0o640), "rb") as f:
        try:
            fcntl.flock(f.fileno(), how | (fcntl.LOCK_NB if busy is not None else 0))
        except BlockingIOError:
            assert busy is not None
            raise busy from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def point_link(link: Path, target: str) -> None:
    """Make `link` a symlink to `target` by rename(2): it names the old target or the new one, never neither."""
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


# what the running agent of a root from before slots kept in ROOT/run (its restart request stays there)
LEGACY_RUN_FILES = ("agent.pid", "health.json", "heartbeat", "report_seq", "spool_dropped", "last_ack.json")
MIGRATION_LOCK_WAIT_S = 30.0


def migrate_layout(root: Path) -> bool:
    """Move a root from before model slots into models/default, keeping its current release; True if it did.

    Every step can be repeated, and ROOT/state.json goes last, so a root that still has it is a migration not
    yet finished, whatever step a crash cut: every command (the service's start too) runs this first and
    finishes it. No reader sees a half-moved slot: the readers of a slot are the commands, which come after.
    1. releases/ is renamed into the slot (one rename(2): every release moves at once, nothing is copied);
    2. the slot's `current` is made to name the same release, then the old link goes (never neither);
    3. the running agent's pid file, health, heartbeat and report counter move (so it can be stopped and
       its report numbers continue);
    4. state.json is written into the slot (atomically), then the old one goes.
    Under the device lock, exclusively (`device_exclusive`): a deploy still running (of any slot, or of an older
    agent) keeps the root until it ends."""
    legacy_state = root / "state.json"
    if not legacy_state.is_file():
        return False
    store = DeviceStore(root)
    deadline = time.monotonic() + MIGRATION_LOCK_WAIT_S
    while True:
        try:
            with store.device_exclusive("moving this device's release into models/default"):
                if not legacy_state.is_file():  # another command finished it while this one waited
                    return False
                _migrate(root, store)
                return True
        except StateError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _migrate(root: Path, store: DeviceStore) -> None:
    make_dirs(store.run_dir)
    old_releases = root / "releases"
    if old_releases.is_dir():
        if not store.releases.exists():
            os.rename(old_releases, store.releases)
        else:  # only a release a crash left behind in both (not from this function): keep the moved ones
            for d in old_releases.iterdir():
                if not (store.releases / d.name).exists():
                    os.rename(d, store.releases / d.name)
            shutil.rmtree(old_releases)
        fsync_dir(store.slot_dir)
    old_current = root / "current"
    if old_current.is_symlink():
        point_link(store.current_link, os.path.join("releases", Path(os.readlink(old_current)).name))
        fsync_dir(store.slot_dir)
        old_current.unlink()
    (root / ".current.tmp").unlink(missing_ok=True)
    for name in LEGACY_RUN_FILES:
        if (root / "run" / name).exists():
            os.replace(root / "run" / name, store.run_dir / name)
    fsync_dir(store.run_dir)
    write_atomic(store.state_path, (root / "state.json").read_bytes())
    (root / "state.json").unlink()
    fsync_dir(root)
