"""Open the right transport for a device."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..inventory import Device
from .transport import LocalTransport, Transport


def open_transport(
    device: Device, known_hosts: Path, connect_timeout: float = 10.0, io_timeout: float = 30.0
) -> Transport:
    if device.transport == "local":
        return LocalTransport()
    from .ssh import SshTransport

    return SshTransport(device, known_hosts, connect_timeout=connect_timeout, io_timeout=io_timeout)


@contextmanager
def connected(
    device: Device, known_hosts: Path, connect_timeout: float = 10.0, io_timeout: float = 30.0
) -> Iterator[Transport]:
    """open_transport() for a `with` block: the connection is closed however the block ends."""
    t = open_transport(device, known_hosts, connect_timeout, io_timeout)
    try:
        yield t
    finally:
        t.close()
