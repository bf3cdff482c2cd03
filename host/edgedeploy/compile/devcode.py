"""Find and describe the device code inside an exported TVM library, without a GPU or CUDA tools.

TVM embeds the device module in the host library: a fatbin (nvcc mode: magic 0xBA55ED50, one entry
per SASS/PTX image, each header naming its SM) or a bare cubin (NVRTC mode: an ELF with machine
EM_CUDA). When the build host could not load the CUDA runtime, TVM silently stores CUDA *source*
instead: then neither is found, and the build must fail.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
ELF_MACHINES = {3: "x86", 62: "x86_64", 40: "arm", 183: "aarch64", 190: "cuda"}
_FATBIN_KIND = {1: "ptx", 2: "sass"}


@dataclass(frozen=True)
class DeviceImage:
    container: str  # "fatbin" | "cubin"
    kind: str  # "sass" | "ptx"
    sm: int
    offset: int
    size: int

    def __str__(self) -> str:
        return f"sm_{self.sm} {self.kind} ({self.container}, {self.size} B)"


def elf_machine(data: bytes, offset: int = 0) -> str:
    """The ELF machine of the object at `offset` (x86_64, aarch64, cuda, ...)."""
    if data[offset : offset + 4] != ELF_MAGIC:
        return "not-elf"
    (machine,) = struct.unpack_from("<H", data, offset + 18)
    return ELF_MACHINES.get(machine, f"machine-{machine}")


def _cubin_sm(data: bytes, offset: int) -> int:
    """SM of a CUDA ELF: the byte holding it moved in ELF ABI version 8 (CUDA 12.8+)."""
    abi_version = data[offset + 8]
    (flags,) = struct.unpack_from("<I", data, offset + 48)  # e_flags of a 64-bit ELF
    return int((flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF)


def _fatbin_images(data: bytes, start: int) -> tuple[list[DeviceImage], int]:
    _, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, start)
    images, off, end = [], start + header_size, start + header_size + fat_size
    while off + 32 <= min(end, len(data)):
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, off)
        (sm,) = struct.unpack_from("<I", data, off + 28)
        if entry_header == 0:
            break
        images.append(DeviceImage("fatbin", _FATBIN_KIND.get(kind, f"kind-{kind}"), sm, off, payload))
        off += entry_header + payload
    return images, end


def find_device_images(data: bytes) -> list[DeviceImage]:
    images: list[DeviceImage] = []
    covered: list[tuple[int, int]] = []
    pos = data.find(FATBIN_MAGIC)
    while pos >= 0:
        found, end = _fatbin_images(data, pos)
        images += found
        covered.append((pos, end))
        pos = data.find(FATBIN_MAGIC, end)
    pos = data.find(ELF_MAGIC, 1)
    while pos >= 0:
        inside = any(a <= pos < b for a, b in covered)
        if not inside and elf_machine(data, pos) == "cuda":
            phoff, shoff = struct.unpack_from("<QQ", data, pos + 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, pos + 54)
            size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            images.append(DeviceImage("cubin", "sass", _cubin_sm(data, pos), pos, size))
        pos = data.find(ELF_MAGIC, pos + 1)
    return images


def device_blobs(data: bytes) -> list[tuple[str, bytes]]:
    """Cut the embedded fatbins and cubins out of a library, e.g. for `cuobjdump --list-elf`."""
    blobs: list[tuple[str, bytes]] = []
    pos = data.find(FATBIN_MAGIC)
    while pos >= 0:
        _, end = _fatbin_images(data, pos)
        blobs.append(("fatbin", data[pos:end]))
        pos = data.find(FATBIN_MAGIC, end)
    for img in find_device_images(data):
        if img.container == "cubin":
            blobs.append(("cubin", data[img.offset : img.offset + img.size]))
    return blobs


@dataclass(frozen=True)
class LibraryReport:
    host_machine: str
    images: list[DeviceImage]
    has_cuda_source: bool

    def sms(self) -> set[int]:
        return {i.sm for i in self.images if i.kind == "sass"}


def inspect_library(path: Path) -> LibraryReport:
    data = path.read_bytes()
    return LibraryReport(
        host_machine=elf_machine(data),
        images=find_device_images(data),
        has_cuda_source=b"__global__" in data and b'extern "C"' in data,
    )
