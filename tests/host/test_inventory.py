from pathlib import Path

import pytest

from edgedeploy.errors import InputError, InventoryError
from edgedeploy.inventory import Device, Inventory


def test_roundtrip_and_select(tmp_path: Path) -> None:
    p = tmp_path / "devices.toml"
    inv = Inventory.load(p)
    inv.add(Device(name="x1", host="10.0.0.5", profile="xavier-agx", tags=["lab", "canary"]))
    inv.add(Device(name="t1", host="t4.local", port=2222, profile="t4", tags=["lab"]))
    again = Inventory.load(p)
    assert again.get("t1").port == 2222 and again.get("x1").service == "systemd"
    assert [d.name for d in again.select(tag="canary")] == ["x1"]
    assert again.known_hosts == tmp_path / "known_hosts"
    with pytest.raises(InventoryError, match="already exists"):
        again.add(Device(name="x1", host="h", profile="t4"))
    again.remove("x1")
    assert list(Inventory.load(p).devices) == ["t1"]


def test_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEDEPLOY_INVENTORY", str(tmp_path / "fleet.toml"))
    assert Inventory.load().path == tmp_path / "fleet.toml"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[devices.x\nhost=1", "not valid TOML"),
        ('[devices.x]\nhost = "h"\n', "devices.x.profile: Field required"),
        ('[devices.x]\nhost = "h"\nprofile = "t4"\nport = 70000\n', "devices.x.port"),
        ('[devices.x]\nhost = "h"\nprofile = "t4"\ncolour = "red"\n', "colour"),
        ('title = "fleet"\n', "expected only"),
        ('[devices.x]\nhost = "h"\nprofile = "t4"\nroot = "/x\\nExecStartPre=/bin/sh"\n', "control character"),
        ('[devices.x]\nhost = "h"\nprofile = "t4"\nuser = "ops\\tx"\n', "devices.x.user"),
        ('[devices.x]\nhost = "h"\nprofile = "t4"\ntags = ["a\\u0000"]\n', "devices.x.tags"),
        (b"\xff\xfe[devices]", "not UTF-8"),
    ],
)
def test_malformed_inventory(tmp_path: Path, text: str | bytes, match: str) -> None:
    p = tmp_path / "devices.toml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError, match=match):  # InventoryError, or InputError for an unreadable file
        Inventory.load(p)


def test_unknown_device_names_known(tmp_path: Path) -> None:
    inv = Inventory(tmp_path / "d.toml", {"a": Device(name="a", host="h", profile="t4")})
    with pytest.raises(InventoryError) as e:
        inv.get("b")
    assert "known devices: a" in (e.value.hint or "")


def test_an_inventory_that_cannot_be_written_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("a file where the config folder should be")
    for path in (tmp_path / "config" / "devices.toml", Path("/proc/edgedeploy-devices.toml")):
        with pytest.raises(InputError, match=f"cannot write inventory {path}"):
            Inventory.load(path).add(Device(name="a", host="h", profile="t4"))
    assert (tmp_path / "config").read_text().startswith("a file")


NAMES_OK = ["cam-01", "a", "A.b_c-1", "9" * 63]
NAMES_REFUSED = ["", "+", "#", "a/b", "cam+", "a b", "-a", ".a", "cam-01\n", "é", "x" * 64, "x" * 300, "x" * 70000]


@pytest.mark.parametrize("name", NAMES_OK + NAMES_REFUSED, ids=lambda n: repr(n[:12]) + f"/{len(n)}")
def test_agent_and_host_accept_the_same_device_names(name: str) -> None:
    """One rule (edgedeploy_agent/names.py): the inventory, the agent's configuration and the controller's
    topic check agree on every name, so a device the host can name is one that can report (issue 40 #9)."""
    from pydantic import ValidationError

    from edgedeploy_agent.config import AgentConfig
    from edgedeploy_agent.names import is_device_name

    try:
        Device(name=name, host="h", profile="t4")
        host = True
    except ValidationError:
        host = False
    try:
        AgentConfig(device_name=name)
        device = True
    except ValidationError:
        device = False
    assert host == device == is_device_name(name) == (name in NAMES_OK)
