"""One device's password cannot take over another device's MQTT session (issue 40, item 4): the broker
configuration edgedeploy generates (fleet_servers.LocalBroker, docs/fleet.md) sets `use_username_as_clientid
true` on the devices' listener, so dev1's account connecting with client id `dev2` is dev1's session: the real
`edgedeploy-agent watch` of dev2 stays connected and its last will (`offline`) never fires. Device accounts
cannot log in on the controller's listener at all."""

from __future__ import annotations

import json
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from edgedeploy.fleet_servers import CONTROLLER
from edgedeploy_agent.desired import status_topic
from tests.integration.pullfleet import PullFleet, wait_for

pytestmark = pytest.mark.integration


def _client(client_id: str, user: str, password: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
    c.username_pw_set(user, password)
    return c


def test_a_device_password_cannot_take_over_another_devices_session(pull_fleet: PullFleet) -> None:
    fleet = pull_fleet
    broker = fleet.broker
    dev2 = fleet.start("dev2")

    # the controller watches dev2's status topic: every message, in order
    seen: list[dict] = []
    lock = threading.Lock()
    watcher = _client("takeover-watcher", CONTROLLER, broker.controller_password)

    def on_message(c: mqtt.Client, u: object, msg: mqtt.MQTTMessage) -> None:
        with lock:
            seen.append(json.loads(msg.payload))

    watcher.on_message = on_message
    watcher.on_connect = lambda c, u, f, rc, p: c.subscribe(status_topic("dev2"), qos=1)
    watcher.connect(broker.host, broker.controller_port)
    watcher.loop_start()
    try:
        wait_for(lambda: any(s.get("state") == "idle" for s in seen), 30)
        with lock:
            seen.clear()

        # dev1's password, client id dev2, on the devices' listener, five times over ~8 s
        connected = []
        for _ in range(5):
            thief = _client("dev2", "dev1", broker.devices["dev1"])
            thief.on_connect = lambda c, u, f, rc, p: connected.append(not rc.is_failure)
            thief.connect(broker.host, broker.port)
            thief.loop_start()
            # it may write only its own status (the ACL names the user, which is now also the client id)
            thief.publish(status_topic("dev2"), b'{"device": "dev2", "state": "offline"}', qos=1).wait_for_publish(5)
            time.sleep(1.5)
            thief.loop_stop()
            thief.disconnect()
        assert connected and all(connected), connected  # it got in: as dev1, not as dev2
        time.sleep(2)
        with lock:
            states = [s.get("state") for s in seen]
        assert "offline" not in states, states  # no will fired, no forged status landed
        assert dev2.proc is not None and dev2.proc.poll() is None, dev2.log()
        broker_log = broker.log.read_text(errors="replace")
        assert "Client dev2 already connected" not in broker_log, broker_log[-2000:]

        # a device account cannot log in where the controller does
        refused: list[bool] = []
        intruder = _client("dev1-on-controller-port", "dev1", broker.devices["dev1"])
        intruder.on_connect = lambda c, u, f, rc, p: refused.append(rc.is_failure)
        intruder.connect(broker.host, broker.controller_port)
        intruder.loop_start()
        wait_for(lambda: refused, 10)
        intruder.loop_stop()
        assert refused == [True]
    finally:
        watcher.loop_stop()
        watcher.disconnect()
