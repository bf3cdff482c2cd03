"""The build checks every aarch64 library against the profile's glibc floor (compile/elf_versions.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgedeploy.compile.elf_versions import glibc_newer_than, version_needs
from edgedeploy.compile.tvm_backend import check_glibc
from edgedeploy.errors import BuildError
from edgedeploy.profiles import get_profile
from tests.helpers import require

CROSS_GCC = "aarch64-linux-gnu-gcc"
OBJDUMP = "aarch64-linux-gnu-objdump"

# pthread_create moved into libc in glibc 2.34: code linked against a newer libc binds GLIBC_2.34
NEW_SYMBOL = (
    "#include <pthread.h>\nint start(pthread_t *t, void *(*f)(void *)) { return pthread_create(t, 0, f, 0); }\n"
)
OLD_SYMBOLS = "#include <string.h>\nvoid copy(char *d, const char *s, size_t n) { memcpy(d, s, n); }\n"


def cross_library(tmp_path: Path, name: str, source: str) -> Path:
    missing = f"{CROSS_GCC} not installed (containers/install-build-deps.sh installs it)"
    require("CROSS_TOOLCHAIN", missing if shutil.which(CROSS_GCC) is None else None)
    c, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    c.write_text(source)
    subprocess.run([CROSS_GCC, "-shared", "-fPIC", "-O1", "-o", str(so), str(c)], check=True)
    return so


def test_a_symbol_newer_than_the_floor_is_refused_by_name(tmp_path: Path) -> None:
    lib = cross_library(tmp_path, "threads", NEW_SYMBOL)
    with pytest.raises(BuildError) as e:
        check_glibc(lib, get_profile("xavier-cpu"))
    assert str(e.value) == (
        "threads.so for xavier-cpu needs pthread_create@GLIBC_2.34 from libc.so.6, newer than the devices' glibc 2.31"
    )
    check_glibc(lib, get_profile("cpu-x86_64"))  # no floor declared: nothing to check


def test_old_symbols_pass_and_the_parser_agrees_with_binutils(tmp_path: Path) -> None:
    lib = cross_library(tmp_path, "copy", OLD_SYMBOLS)
    check_glibc(lib, get_profile("xavier-cpu"))
    assert glibc_newer_than(lib, "2.17") == []
    needs = {(n.version, s) for n in version_needs(lib.read_bytes()) for s in n.symbols}
    assert ("GLIBC_2.17", "memcpy") in needs
    if shutil.which(OBJDUMP):
        dump = subprocess.run([OBJDUMP, "-T", str(lib)], capture_output=True, text=True, check=True).stdout
        undefined = set(re.findall(r"\*UND\*\s+\S+\s+\(?(GLIBC_[0-9.]+)\)?\s+(\S+)", dump))
        assert undefined == {(v, s) for v, s in needs if v.startswith("GLIBC_")}


def test_not_an_elf_file_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "x.so").write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        glibc_newer_than(tmp_path / "x.so", "2.31")
