import re
from pathlib import Path

import pytest

from edgedeploy.errors import ProfileError
from edgedeploy.profiles import all_profiles, get_profile

EXPECTED = {
    "cpu-x86_64": ("x86_64", None),
    "cpu-x86_64-v4": ("x86_64", None),
    "t4": ("x86_64", 75),
    "xavier-agx": ("aarch64", 72),
    "xavier-nx": ("aarch64", 72),
    "xavier-cpu": ("aarch64", None),
    "h200": ("x86_64", 90),
}


def test_builtin_profiles() -> None:
    profs = all_profiles()
    assert set(EXPECTED) <= set(profs)
    for name, (arch, sm) in EXPECTED.items():
        assert (profs[name].arch, profs[name].cuda_sm) == (arch, sm)
    x = get_profile("xavier-agx")
    assert x.platform.cuda == "11.4" and x.platform.tensorrt == "8.5.2" and x.platform.python == "3.9"
    assert x.compiler.target["host"]["mtriple"] == "aarch64-linux-gnu"
    assert {get_profile(p).platform.glibc for p in ("xavier-agx", "xavier-nx", "xavier-cpu")} == {"2.31"}


def test_the_xavier_cpu_profile_promises_what_carmel_has() -> None:
    """mcpu carmel (LLVM): ARMv8.2-A with fullfp16, rdm, lse, crc, aes, sha2 and no dotprod; its cpu_features are
    those as a Xavier's /proc/cpuinfo names them (the fixture: an AGX Xavier's, as in LLVM's Host test), so the
    agent refuses an ARMv8.0 board and the bundle has no sdot."""
    import tvm
    from tvm.target import codegen

    p = get_profile("xavier-cpu")
    llvm = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(p.compiler.target))}
    assert {"v8.2a", "neon", "fullfp16", "rdm", "lse", "crc", "aes", "sha2"} <= llvm and "dotprod" not in llvm
    xavier = (Path(__file__).parents[1] / "agent" / "fixtures" / "cpuinfo-carmel.txt").read_text()
    features = set(re.search(r"^Features\s*:(.*)$", xavier, re.M).group(1).split())  # type: ignore[union-attr]
    assert set(p.compiler.cpu_features) <= features and "asimddp" not in features


@pytest.mark.parametrize("name", ["cpu-x86_64", "cpu-x86_64-v4"])
def test_the_x86_profiles_promise_what_their_llvm_target_uses(name: str) -> None:
    """Every instruction set LLVM may use for the profile's target is in its cpu_features (/proc/cpuinfo names),
    so the agent refuses a CPU without it; the v4 profile's bundles get the VNNI 1x1 INT8 kernels."""
    import tvm
    from tvm.target import codegen

    from edgedeploy.compile.int8.x86_int8 import AVX2, VNNI, dot_kind

    p = get_profile(name)
    llvm = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(p.compiler.target))}
    cpuinfo = {"sse3": "pni", "lzcnt": "abm", "bmi": "bmi1", "avx512vnni": "avx512_vnni"}
    isa = {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt"}
    isa |= {"movbe", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512vnni"}
    needed = {cpuinfo.get(f, f.replace(".", "_")) for f in llvm & isa}
    assert needed <= set(p.compiler.cpu_features)
    assert ("avx512f" in llvm, dot_kind(p)) == ((False, AVX2) if name == "cpu-x86_64" else (True, VNNI))


def test_user_profiles_are_added_and_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "p"
    d.mkdir()
    (d / "orin.toml").write_text(
        'name = "my-cpu"\ndescription = "x"\narch = "aarch64"\ndevice = "cpu"\n'
        '[compiler]\ntarget = { kind = "llvm" }\nhost_triple = "aarch64-linux-gnu"\n[platform]\npython = "3.10"\n'
        'glibc = "2.35"\n'
    )
    monkeypatch.setenv("EDGEDEPLOY_PROFILES", str(d))
    assert get_profile("my-cpu").arch == "aarch64"
    (d / "orin.toml").write_text((d / "orin.toml").read_text().replace('glibc = "2.35"\n', ""))
    with pytest.raises(ProfileError, match="an aarch64 profile must set platform.glibc"):
        all_profiles()  # the build checks its libraries against the devices' glibc: it must know it
    (d / "orin.toml").unlink()
    (d / "bad.toml").write_text('name = "bad"\narch = "sparc"\n')
    with pytest.raises(ProfileError, match="bad.toml"):
        all_profiles()


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ProfileError) as e:
        get_profile("jetson-nano")
    assert "xavier-agx" in (e.value.hint or "")


def test_a_profile_file_that_is_not_utf8_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgedeploy.errors import InputError

    (tmp_path / "latin1.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    monkeypatch.setenv("EDGEDEPLOY_PROFILES", str(tmp_path))
    with pytest.raises(InputError, match="latin1.toml is not UTF-8 text"):
        all_profiles()


def test_a_profile_or_card_that_is_not_toml_or_has_a_wrong_field_names_the_file(tmp_path: Path) -> None:
    from edgedeploy.compile.cards import load_card
    from edgedeploy.errors import InputError
    from edgedeploy.profiles import load_profile_file

    broken, wrong = tmp_path / "broken.toml", tmp_path / "wrong.toml"
    broken.write_text("name = \n")
    wrong.write_text('name = "x"\nlabels = 3\n')
    with pytest.raises(ProfileError, match=f"^profile {re.escape(str(broken))} is not valid TOML: "):
        load_profile_file(broken)
    with pytest.raises(ProfileError, match=f"^profile {re.escape(str(wrong))}: "):
        load_profile_file(wrong)
    with pytest.raises(InputError, match=f"^model card {re.escape(str(broken))} is not valid TOML: "):
        load_card(broken)
    with pytest.raises(InputError, match=f"^model card {re.escape(str(wrong))}: labels: "):
        load_card(wrong)
