"""THE facts wire format: what `edgedeploy-agent --json facts` answers (besides `ok`), defined once here,
printed by the agent and validated by the host (edgedeploy.remote.facts). A renamed or unknown key is an
error on the host, never a silent default. Captured output: tests/fixtures/agent/facts.json (kept current
by tests/agent/test_facts_format.py)."""

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class ReleaseFacts(BaseModel):
    """The release `current` names, from its manifest (`readable: false` when that cannot be read)."""

    model_config = ConfigDict(extra="forbid")

    release: str
    readable: bool = True
    model: Optional[str] = None
    version: Optional[str] = None
    profile: Optional[str] = None
    bundle_id: Optional[str] = None


class BlobFacts(BaseModel):
    """`facts --blobs SHA...`: which of them the device lacks, partial uploads (bytes), free space."""

    model_config = ConfigDict(extra="forbid")

    missing: list[str]
    partial: dict[str, int]
    free_bytes: int


class SlotFacts(BaseModel):
    """One model slot: its source, whether its agent runs, its health, release and transition."""

    model_config = ConfigDict(extra="forbid")

    source: Optional[str] = None
    running: Optional[bool] = None  # None: systemd mode, and no unit serves the slot
    health: Optional[dict[str, Any]] = None  # its run/health.json as readers see it (`dead` when its writer is gone)
    current: Optional[ReleaseFacts] = None
    previous: list[str] = []
    pending: Optional[dict[str, Any]] = None  # a transition in flight, or one a crash left for `recover`


class Facts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_version: str
    bundle_schema: int
    python: str
    arch: str
    root: str
    initialised: bool
    uid: int
    free_bytes: Optional[int]
    # an initialised root also says:
    busy: Optional[bool] = None  # a deploy, rollback or recovery holds the device's lock now
    service: Optional[str] = None
    slot: Optional[str] = None  # the model slot the fields from `source` to `pending` describe (`facts --model`)
    source: Optional[str] = None
    sources: list[str] = []  # several sources in one agent
    running: Optional[bool] = None
    health: Optional[dict[str, Any]] = None  # run/health.json as readers see it (`dead` when its writer is gone)
    current: Optional[ReleaseFacts] = None
    previous: list[str] = []
    history: list[dict[str, Any]] = []
    profile: Optional[str] = None
    trusted_keys: list[str] = []
    serial: Optional[int] = None
    pending: Optional[dict[str, Any]] = None  # a transition in flight, or one a crash left for `recover`
    blobs: Optional[BlobFacts] = None
    models: Optional[dict[str, SlotFacts]] = None  # every model slot, `default` first

    @model_serializer(mode="wrap")
    def _omit_no_sources(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # `sources` only where there are several: a host from before them reads a one-source device's facts on
        data: dict[str, Any] = handler(self)
        if not data.get("sources"):
            data.pop("sources", None)
        return data
