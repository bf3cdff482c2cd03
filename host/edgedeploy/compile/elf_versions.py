"""Which glibc symbol versions a shared library needs, read from its ELF (no binutils needed).

A cross compiler links against its own libc: Debian 12's aarch64 gcc has glibc 2.36, a Jetson on
JetPack 5 has 2.31. The dynamic loader refuses a library whose version needs (`.gnu.version_r`) name a
version the device's libc lacks ("version `GLIBC_2.34' not found"), so the build checks them against
the profile's `platform.glibc` and names the symbol that needs the newer version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from .cuda.devcode import ELF_MAGIC

SHT_DYNSYM = 11
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF


@dataclass(frozen=True)
class VersionNeed:
    library: str  # e.g. libc.so.6
    version: str  # e.g. GLIBC_2.34
    symbols: tuple[str, ...]  # the undefined symbols bound to this version (may be empty)

    def glibc(self) -> tuple[int, ...] | None:
        """(2, 34) for GLIBC_2.34; None for other version names (GCC_3.0, GLIBC_PRIVATE, ...)."""
        prefix, _, number = self.version.partition("_")
        parts = number.split(".")
        if prefix != "GLIBC" or not all(p.isdigit() for p in parts):
            return None
        return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def _sections(data: bytes) -> list[_Section]:
    if data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    out = []
    for i in range(shnum):
        _, sh_type, _, _, offset, size, link, _, _, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize
        )
        out.append(_Section(sh_type, offset, size, link, entsize))
    return out


def _string(data: bytes, table: _Section, offset: int) -> str:
    start = table.offset + offset
    return data[start : data.index(b"\0", start)].decode("utf-8", "replace")


def version_needs(data: bytes) -> list[VersionNeed]:
    """Every version the library needs from another one, with the undefined symbols bound to it."""
    sections = _sections(data)
    by_type = {s.type: s for s in sections}
    verneed = by_type.get(SHT_GNU_VERNEED)
    if verneed is None:
        return []
    strings = sections[verneed.link]
    needs: dict[int, tuple[str, str]] = {}  # version index -> (library, version name)
    off = verneed.offset
    while True:
        _, count, file_name, aux, next_need = struct.unpack_from("<HHIII", data, off)
        library = _string(data, strings, file_name)
        a = off + aux
        for _ in range(count):
            _, _, index, name, next_aux = struct.unpack_from("<IHHII", data, a)
            needs[index] = (library, _string(data, strings, name))
            a += next_aux
        if not next_need:
            break
        off += next_need
    symbols: dict[int, list[str]] = {i: [] for i in needs}
    dynsym, versym = by_type.get(SHT_DYNSYM), by_type.get(SHT_GNU_VERSYM)
    if dynsym is not None and versym is not None:
        names = sections[dynsym.link]
        for i in range(dynsym.size // dynsym.entsize):
            st_name, _, _, shndx = struct.unpack_from("<IBBH", data, dynsym.offset + i * dynsym.entsize)
            (index,) = struct.unpack_from("<H", data, versym.offset + 2 * i)
            index &= 0x7FFF  # bit 15: hidden
            if shndx == 0 and index in symbols:  # undefined here: bound to the other library's version
                symbols[index].append(_string(data, names, st_name))
    return [VersionNeed(lib, ver, tuple(sorted(symbols[i]))) for i, (lib, ver) in sorted(needs.items())]


def glibc_newer_than(path: Path, floor: str) -> list[VersionNeed]:
    """The library's glibc version needs newer than `floor` ("2.31"), newest first."""
    limit = tuple(int(p) for p in floor.split("."))
    too_new = [n for n in version_needs(path.read_bytes()) if (n.glibc() or ()) > limit]
    return sorted(too_new, key=lambda n: n.glibc() or (), reverse=True)
