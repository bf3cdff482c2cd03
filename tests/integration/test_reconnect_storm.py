"""A fleet whose broker restarts does not come back all at once (mosquitto 2.0.11 grows under reconnect
storms, upstream #2830): the agents' real MQTT loop (`Watcher._network`, `backoff_delay`) against a real
mosquitto that is stopped and started again.

What is asserted is the shape of the reconnects, not how long they took: every retry waits at least the
lower half of its exponential ceiling (so no client retries in a tight loop, and the waits grow), the
ceiling stops at `backoff_max_s`, and after the restart the clients arrive spread over the jitter window
rather than in one burst; all of them come back.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.fleet_servers import LocalBroker, servers_available
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.store import DeviceStore
from edgedeploy_agent.watch import WatchConfig, Watcher
from tests.helpers import require

pytestmark = [pytest.mark.integration, pytest.mark.fleet_servers]

CLIENTS = 40
LOW, HIGH = 0.25, 2.0  # backoff_min_s, backoff_max_s: the ceilings are 0.25 0.5 1 2 2 2 ...
DOWN_S = 6.0  # long enough for every client to reach the cap (0.125+0.25+0.5+1 = 1.9 s of lower bounds)


class Recorded:
    """One device's real watch loop; every CONNECT attempt it makes is timed (an observation, nothing replaced)."""

    def __init__(self, root: Path, name: str, broker: LocalBroker, seed: int) -> None:
        store = DeviceStore(root)
        store.init(AgentConfig(device_name=name, service="process"))
        (root / "pw").write_text(broker.devices[name])
        cfg = WatchConfig(
            broker=broker.address, registry_url="http://127.0.0.1:9", password_file=str(root / "pw"),
            backoff_min_s=LOW, backoff_max_s=HIGH, keepalive_s=5,
        )  # fmt: skip
        self.watcher = Watcher(store, cfg)
        self.watcher.rng = random.Random(seed)  # reproducible jitter; the formula is the agent's
        self.watcher.client = client = self.watcher._make_client()
        self.attempts: list[float] = []
        connect = client.connect

        def timed_connect(*args: Any, **kwargs: Any) -> Any:
            self.attempts.append(time.monotonic())
            return connect(*args, **kwargs)

        client.connect = timed_connect
        self.thread = threading.Thread(target=self.watcher._network, daemon=True)

    def close(self) -> None:
        self.watcher.stop.set()
        if self.watcher.connected.is_set():
            self.watcher.client.disconnect()
        self.thread.join(10)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[LocalBroker, list[Recorded]]]:
    require("FLEET_SERVERS", servers_available())
    names = [f"cam{i:03d}" for i in range(CLIENTS)]
    broker = LocalBroker({n: f"pw-{n}" for n in names}, "controller-pw").start()
    clients = [Recorded(tmp_path / n, n, broker, seed=i) for i, n in enumerate(names)]
    try:
        yield broker, clients
    finally:
        for c in clients:
            c.close()
        broker.close()


def wait_until(what: str, check: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not true within {timeout} s: {what}")


def test_clients_come_back_from_a_broker_restart_spread_out_with_bounded_backoff(
    fleet: tuple[LocalBroker, list[Recorded]],
) -> None:
    broker, clients = fleet
    for c in clients:
        c.thread.start()
    wait_until("all clients connected", lambda: all(c.watcher.connected.is_set() for c in clients), 60)
    for c in clients:
        c.attempts.clear()

    broker.stop()
    time.sleep(DOWN_S)
    back = time.monotonic()
    broker.start()  # a client may connect before start() returns (CI saw it): arrivals count from before it
    # the cap bounds how long a client stays away: its next attempt is at most HIGH after the restart
    wait_until("all clients reconnected", lambda: all(c.watcher.connected.is_set() for c in clients), 60)

    arrivals = []
    for c in clients:
        # the waits between attempts while the broker was away (each followed a refusal)
        failed_gaps = [b - a for a, b in pairwise(t for t in c.attempts if t < back)]
        assert len(failed_gaps) >= 4, c.attempts  # it was away long enough to reach the cap
        for i, gap in enumerate(failed_gaps):
            # after the session is lost: wait (attempt 0), try, refused: wait (attempt 1), try, ...
            ceiling = min(HIGH, LOW * 2 ** (i + 1))
            assert gap >= ceiling / 2 - 0.01, (i, gap, c.attempts)  # no tight loop; the waits grow
        arrivals.append(c.attempts[-1] - back)  # the last attempt is the one that connected

    arrivals.sort()
    busiest = max(sum(1 for t in arrivals[i:] if t - first < 0.25) for i, first in enumerate(arrivals))
    print(
        f"\n{CLIENTS} clients back {arrivals[0]:.2f}-{arrivals[-1]:.2f} s after the restart; busiest 0.25 s: {busiest}"
    )
    # spread over the jitter window (equal jitter: each wait is uniform in [cap/2, cap]) ...
    assert arrivals[-1] - arrivals[0] >= HIGH / 4, arrivals
    # ... not one burst: no quarter of a second holds half the fleet
    assert busiest <= CLIENTS // 2, arrivals
    # and bounded: every client tried again within the cap after the broker came back (plus load slack)
    assert arrivals[-1] <= HIGH + 5.0, arrivals
