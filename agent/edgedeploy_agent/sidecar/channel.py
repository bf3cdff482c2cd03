"""The wire between the agent and its sidecar worker: bounded JSON messages on a pipe, arrays in shared memory.

Messages are a 4-byte big-endian length and that many bytes of UTF-8 JSON, at most MAX_MESSAGE bytes: a
message over the bound, or one that is not a JSON object, ends the conversation (ChannelClosed). Arrays and
engine plans never travel in messages: they lie in one memfd both processes map (`SharedMemory`), and a
message names them by offset, shape and dtype. Either side may grow the memfd; the other maps it again
when a message names bytes past its current view.

Standard library and numpy only, Python 3.8: this module runs under JetPack's own Python too.
"""

from __future__ import annotations

import json
import mmap
import os
import select
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_MESSAGE = 1 << 20
_LEN = struct.Struct(">I")
ALIGN = 64


class ChannelClosed(Exception):
    """The other side closed its end, died, or sent something that is not a message."""


class ChannelTimeout(Exception):
    """No message arrived within the time given."""


class Channel:
    """One direction in, one out: file descriptors of two pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
        payload = _LEN.pack(len(data)) + data
        try:
            while payload:
                payload = payload[os.write(self.write_fd, payload) :]
        except (BrokenPipeError, OSError) as e:
            raise ChannelClosed(f"cannot write: {e}") from None

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message; ChannelTimeout after `timeout` seconds without one (None: wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        header = self._read(_LEN.size, deadline)
        (size,) = _LEN.unpack(header)
        if size > MAX_MESSAGE:
            raise ChannelClosed(f"message of {size} bytes announced, the limit is {MAX_MESSAGE}")
        try:
            message = json.loads(self._read(size, deadline).decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise ChannelClosed(f"not a message: {e}") from None
        if not isinstance(message, dict):
            raise ChannelClosed("not a message: a JSON object was expected")
        return message

    def _read(self, n: int, deadline: float | None) -> bytes:
        while len(self._buffer) < n:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([self.read_fd], [], [], wait)
            if not ready:
                raise ChannelTimeout()
            chunk = os.read(self.read_fd, max(n - len(self._buffer), 65536))
            if not chunk:
                raise ChannelClosed("the other side closed the channel")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def close(self) -> None:
        """Once: a second call must not close whatever file now has the numbers (a double close in the agent,
        or in the test process, closes someone else's pipe or socket)."""
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.read_fd = self.write_fd = -1


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class SharedMemory:
    """A memfd mapped in both processes; arrays are placed at 64-byte aligned offsets."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None
        self._mapped = 0

    @classmethod
    def create(cls, name: str) -> SharedMemory:
        """A new, empty memfd; give `fd` to the worker (it is inheritable)."""
        fd = os.memfd_create(name, 0)
        os.set_inheritable(fd, True)
        return cls(fd)

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def ensure(self, size: int) -> None:
        """At least `size` bytes, mapped here (grows the memfd, never shrinks it). Per frame this is one
        comparison: the memfd is asked for its size only when the mapping here is too small (the other side may
        have grown it)."""
        if self._mapped >= size:
            return
        if self.size < size:
            os.ftruncate(self.fd, _aligned(size))
        self._remap()

    def _remap(self) -> None:
        size = self.size
        # the old map is dropped, not closed: views handed out earlier keep it alive until they go
        self._map = mmap.mmap(self.fd, size) if size else None
        self._mapped = size

    def array(self, spec: dict[str, Any]) -> np.ndarray:
        """A view (not a copy) of the array a message describes: {"offset", "shape", "dtype"}."""
        dtype = np.dtype(str(spec["dtype"]))
        shape = tuple(int(d) for d in spec["shape"])
        count = int(np.prod(shape)) if shape else 1
        offset = int(spec["offset"])
        if offset < 0 or offset % ALIGN or any(d < 0 for d in shape):
            raise ValueError(f"bad array placement {spec}")
        self.ensure(offset + count * dtype.itemsize)
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)  # type: ignore[arg-type]

    def bytes_at(self, offset: int, size: int) -> bytes:
        self.ensure(offset + size)
        assert self._map is not None
        return self._map[offset : offset + size]

    def put_bytes(self, data: bytes, offset: int = 0) -> dict[str, int]:
        self.ensure(offset + len(data))
        assert self._map is not None
        self._map[offset : offset + len(data)] = data
        return {"offset": offset, "size": len(data)}

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive: the map goes with it
                pass
            self._map = None
        if self.fd >= 0:  # once, as Channel.close
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


def place(arrays: Sequence[Any], start: int = 0) -> list[dict[str, Any]]:
    """Placements for arrays (or (shape, dtype) pairs) one after another from `start`, aligned."""
    specs, offset = [], _aligned(start)
    for a in arrays:
        shape, dtype = (a.shape, a.dtype) if isinstance(a, np.ndarray) else a
        dtype = np.dtype(dtype)
        specs.append({"offset": offset, "shape": [int(d) for d in shape], "dtype": dtype.str})
        offset = _aligned(offset + int(np.prod(shape)) * dtype.itemsize)
    return specs


def end_of(specs: Sequence[dict[str, Any]]) -> int:
    """The first aligned offset after the arrays `specs` place."""
    end = 0
    for s in specs:
        end = max(end, int(s["offset"]) + int(np.prod(s["shape"])) * np.dtype(str(s["dtype"])).itemsize)
    return _aligned(end)
