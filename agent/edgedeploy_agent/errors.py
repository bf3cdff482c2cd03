"""One error root for the agent; each subclass carries a stable code that reaches the host."""

from __future__ import annotations


class AgentError(Exception):
    """Something a technician can act on; `code` is stable and machine-readable."""

    code = "agent-error"
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "hint": self.hint}


class BundleError(AgentError):
    """The bundle file is malformed, tampered with or unreadable."""

    code = "bad-bundle"
    exit_code = 3


class IncompatibleBundle(AgentError):
    """The bundle is valid but made for another device, runtime or schema."""

    code = "incompatible-bundle"
    exit_code = 4


class InsufficientSpace(AgentError):
    """Not enough free disk for the bundle and its unpacked release."""

    code = "no-space"
    exit_code = 5


class RuntimeLoadError(AgentError):
    """The inference runtime could not load the bundle."""

    code = "runtime-load-failed"
    exit_code = 6


class SidecarFailed(RuntimeLoadError):
    """The sidecar worker (TensorRT or capture under JetPack's Python) died, hung or could not start."""

    code = "sidecar-failed"


class SourceError(AgentError):
    """A frame source URI is invalid or cannot be opened."""

    code = "source-error"
    exit_code = 7


class HealthCheckFailed(AgentError):
    """The newly activated bundle did not report healthy; the device was rolled back."""

    code = "health-check-failed"
    exit_code = 8


class StateError(AgentError):
    """The device store is not initialised or its state is inconsistent."""

    code = "state-error"
    exit_code = 9


class UntrustedBundle(AgentError):
    """The bundle's signature, serial or expiry does not satisfy the keys pinned on this device."""

    code = "untrusted-bundle"
    exit_code = 10


class UnsignedBundle(UntrustedBundle):
    code = "unsigned-bundle"


class BadSignature(UntrustedBundle):
    code = "bad-signature"


class ReplayedBundle(UntrustedBundle):
    code = "replayed-bundle"


class ExpiredBundle(UntrustedBundle):
    code = "expired-bundle"


class FrameFailed(AgentError):
    """A real frame failed in preprocessing, inference or postprocessing, or gave bad outputs."""

    code = "frame-failed"
    exit_code = 11


class SourceUnavailable(AgentError):
    """The frame source delivered no frame, so the bundle could not be shown to serve; rolled back."""

    code = "source-unavailable"
    exit_code = 12
