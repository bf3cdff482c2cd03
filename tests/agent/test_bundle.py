import gzip
import json
import tarfile
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    SIGNATURE_NAME,
    WRITTEN_SCHEMA_VERSION,
    HostFile,
    Manifest,
    check_compatible,
    extract_bundle,
    manifest_json_schema,
    read_manifest,
    verify_bundle,
    write_bundle,
)
from edgedeploy_agent.errors import BundleError, IncompatibleBundle
from tests.agent.bundles import make_bundle, rewrite_bundle

REPO = Path(__file__).resolve().parents[2]


def test_roundtrip_manifest_first_and_reproducible(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "a")
    with tarfile.open(b, "r|gz") as t:
        names = [m.name for m in t]
    assert names[0] == MANIFEST_NAME
    assert sorted(names[1:]) == ["labels.txt", "model.so"]
    m = read_manifest(b)
    assert verify_bundle(b) == m
    out = tmp_path / "x"
    extract_bundle(b, out)
    assert (out / "model.so").read_bytes() == b"\x7fELF fake library"
    assert Manifest.model_validate_json((out / MANIFEST_NAME).read_bytes()).bundle_id == m.bundle_id
    # same inputs, same bytes: bundles are reproducible
    assert make_bundle(tmp_path / "b").read_bytes() == b.read_bytes()


def test_tampered_artifact_is_refused(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)
    bad = rewrite_bundle(
        b, tmp_path / "bad.edb", lambda n, d: (n, d.replace(b"fake", b"evil")) if n == "model.so" else (n, d)
    )
    with pytest.raises(BundleError, match="sha256 mismatch for model.so"):
        verify_bundle(bad)
    with pytest.raises(BundleError, match="sha256 mismatch"):
        extract_bundle(bad, tmp_path / "out")


def test_truncated_and_extra_members_are_refused(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)
    missing = rewrite_bundle(b, tmp_path / "m.edb", lambda n, d: None if n == "labels.txt" else (n, d))
    with pytest.raises(BundleError, match="missing labels.txt"):
        verify_bundle(missing)
    traversal = rewrite_bundle(
        b, tmp_path / "t.edb", lambda n, d: ("../labels.txt", d) if n == "labels.txt" else (n, d)
    )
    fresh = tmp_path / "fresh"  # nothing the fixture wrote: "../labels.txt" from fresh/out lands here
    fresh.mkdir()
    with pytest.raises(BundleError, match="unexpected member"):
        extract_bundle(traversal, fresh / "out")
    assert not (fresh / "labels.txt").exists() and [p.name for p in fresh.iterdir()] in ([], ["out"])


def test_symlink_member_is_refused(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)
    dst = tmp_path / "link.edb"
    with tarfile.open(b, "r|gz") as tin, gzip.open(dst, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as tout:
        for m in tin:
            if m.name == "model.so":
                link = tarfile.TarInfo("model.so")
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tout.addfile(link)
            else:
                tout.addfile(m, tin.extractfile(m))
    with pytest.raises(BundleError, match="not a regular file|is 0 bytes"):
        extract_bundle(dst, tmp_path / "out")


def test_garbage_and_bad_manifest(tmp_path: Path) -> None:
    g = tmp_path / "garbage.edb"
    g.write_bytes(b"this is not a bundle")
    with pytest.raises(BundleError, match="not a readable bundle|corrupt"):
        read_manifest(g)
    b = make_bundle(tmp_path)
    bad = rewrite_bundle(
        b, tmp_path / "bm.edb", lambda n, d: (n, b'{"schema_version": 1}') if n == MANIFEST_NAME else (n, d)
    )
    with pytest.raises(BundleError, match="invalid manifest"):
        read_manifest(bad)
    with pytest.raises(BundleError, match="no such bundle"):
        read_manifest(tmp_path / "absent.edb")


def test_newer_schema_and_other_arch_are_incompatible(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)

    def bump(n: str, d: bytes):
        if n != MANIFEST_NAME:
            return n, d
        data = json.loads(d)
        data["schema_version"] = 99
        return n, json.dumps(data).encode()

    with pytest.raises(IncompatibleBundle, match="schema 99"):
        read_manifest(rewrite_bundle(b, tmp_path / "s.edb", bump))
    arm = read_manifest(make_bundle(tmp_path / "arm", arch="aarch64"))
    with pytest.raises(IncompatibleBundle, match="aarch64"):
        check_compatible(arm, machine="x86_64")
    check_compatible(arm, machine="aarch64")


def test_docs_schema_is_generated_from_the_models() -> None:
    committed = json.loads((REPO / "docs" / "bundle-manifest.schema.json").read_text())
    assert committed == manifest_json_schema(), "regenerate docs/ with `python -m edgedeploy.schema`"


def test_signature_member_twice_or_late_is_a_bad_bundle(tmp_path: Path) -> None:
    """Not an OS error from writing the second copy: a refusal the host and the device name `bad-bundle`."""
    src = make_bundle(tmp_path / "src")
    signed = write_bundle(
        tmp_path / "signed.edb",
        read_manifest(src),
        {"labels.txt": tmp_path / "src" / "labels.txt", "model.so": tmp_path / "src" / "model-1.so"},
        signature=b"s" * 64,
    )
    extract_bundle(signed, tmp_path / "ok")  # one signature right after the manifest is fine
    twice = rewrite_bundle(signed, tmp_path / "twice.edb", lambda n, d: (n, d), repeat=SIGNATURE_NAME)
    late = rewrite_bundle(
        src, tmp_path / "late.edb", lambda n, d: (n, d), after="model.so", extra=(SIGNATURE_NAME, b"s")
    )
    for bad in (twice, late):
        with pytest.raises(BundleError, match="must appear once, right after manifest.json") as e:
            extract_bundle(bad, tmp_path / bad.stem)
        assert e.value.code == "bad-bundle"
        with pytest.raises(BundleError, match="must appear once"):
            verify_bundle(bad)


def test_schema_1_manifest_parses_and_keeps_its_bytes() -> None:
    """A manifest captured from a bundle built before host files left the bundle (b744a8c, mnist-8 FP32,
    model.onnx inside): this agent reads it and writes back the same bytes, so the bundle id is unchanged."""
    body = (Path(__file__).parent / "fixtures" / "manifest-schema1-mnist.json").read_bytes()
    m = Manifest.model_validate_json(body)
    assert m.schema_version == 1 and m.host_files == []
    assert {a.role for a in m.artifacts} == {"onnx-model", "tvm-library"}
    assert m.canonical_bytes() == body


def test_host_files_are_listed_but_never_unpacked(tmp_path: Path) -> None:
    sha = "ab" * 32
    hf = HostFile(name="model.onnx", role="onnx-model", sha256=sha, size=3)
    b = make_bundle(tmp_path, host_files=[hf])
    m = extract_bundle(b, tmp_path / "rel")
    assert m.schema_version == WRITTEN_SCHEMA_VERSION == 2 and SCHEMA_VERSION == 5 and m.host_files == [hf]
    assert sorted(p.name for p in (tmp_path / "rel").iterdir()) == ["labels.txt", "manifest.json", "model.so"]
    assert json.loads((tmp_path / "rel" / MANIFEST_NAME).read_bytes())["host_files"][0]["sha256"] == sha
