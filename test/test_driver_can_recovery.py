"""The PIPER driver when its CAN interface goes away: reopen with back-off, quiet, no spinning.

Two situations, with the real piper_sdk:

- *The bus dies under a running driver* (an unplugged adapter): the node runs in this process
  with the emulated arm; the test shuts down the python-can buses under piper_sdk's interface
  object, so every receive and send of the SDK fails as on a vanished socketcan interface,
  and also silences the emulated arm for a while. The driver must hold, refuse ``~/enable``,
  reopen the port with back-off (piper_sdk's reader thread must not spin meanwhile), keep the
  SDK's error lines off stderr, and drive again after ``~/clear_fault`` once the arm answers.
- *The interface does not exist at start* (socketcan, a channel name no machine has): the node
  runs in its own process; its output must not grow with every retry.
"""

from __future__ import annotations

import os

import pytest

from test.ros_env import require_ros

rclpy, hmsg, hsrv = require_ros()

from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from test.polling import wait_until  # noqa: E402
from test.test_driver_command_stream import Commander  # noqa: E402
from test.test_node_driver import Driver, DriverProcess  # noqa: E402
from test.test_node_driver_can_frames import Rig, controller_values, driver_rig  # noqa: E402
from test.test_piper_emulated import kill_the_bus, reader_cpu_s  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'bustype' argument is deprecated:DeprecationWarning"
)

TIMEOUT_S = 20.0


def arm_values(rig: Rig) -> dict[str, str]:
    return {kv.key: kv.value for kv in rig.node.arm_diagnostic().values}


def call(rig: Rig, service: str) -> Trigger.Response:
    """Call ``~/<service>`` of the rig's driver from the peer, over DDS."""
    client = rig.peer.create_client(Trigger, f"{rig.node.get_fully_qualified_name()}/{service}")
    executor = SingleThreadedExecutor(context=rig.peer.context)
    executor.add_node(rig.peer)
    try:
        assert client.wait_for_service(timeout_sec=TIMEOUT_S)
        future = client.call_async(Trigger.Request())
        executor.spin_until_future_complete(future, timeout_sec=TIMEOUT_S)
        assert future.done(), f"no answer from ~/{service}"
        return future.result()
    finally:
        executor.remove_node(rig.peer)
        executor.shutdown()
        rig.peer.destroy_client(client)


def test_a_bus_that_dies_is_reopened_with_back_off_and_the_driver_recovers(capfd):
    overrides = {"reconnect_period_s": 0.5, "reconnect_max_period_s": 1.0}
    with driver_rig("can-gone", **overrides) as rig:
        cmd = Commander(rig)
        start = cmd.position()
        cmd.send(1, (0.0, 0.0, -0.01))
        cmd.settle(start + [0.0, 0.0, -0.01])
        capfd.readouterr()
        sdk_lines = int(arm_values(rig)["sdk_log_lines"])

        rig.node.emulator.set_can_link(False)  # the arm stays silent for a while...
        kill_the_bus(rig.channel)  # ...and the interface goes away under piper_sdk
        assert wait_until(lambda: controller_values(rig.node)["status"] == "fault", TIMEOUT_S)
        reply = call(rig, "enable")
        assert not reply.success and "CAN lost" in reply.message, reply.message
        cmd.send(2, (0.0, 0.0, -0.01))
        assert "controller is fault" in cmd.value("last_rejected_reason")
        assert wait_until(lambda: int(arm_values(rig)["link_reopens"]) >= 1, TIMEOUT_S)
        # The driver's holds went into the dead bus (piper_sdk logged, captured, each frame).
        assert wait_until(lambda: int(arm_values(rig)["sdk_log_lines"]) > sdk_lines, TIMEOUT_S)

        # Reopened with back-off (0.5 s, then 1 s); the SDK's reader does not spin meanwhile.
        cpu = reader_cpu_s()
        assert wait_until(lambda: int(arm_values(rig)["link_reopens"]) >= 3, TIMEOUT_S)
        assert reader_cpu_s() - cpu < 0.3
        assert "reopened; waiting for the arm" in arm_values(rig)["link_error"]

        rig.node.emulator.set_can_link(True)  # the arm answers again: no restart needed
        assert wait_until(lambda: arm_values(rig)["link_error"] == "", TIMEOUT_S)
        reply = call(rig, "enable")  # still latched
        assert not reply.success and "~/clear_fault" in reply.message, reply.message
        assert wait_until(lambda: call(rig, "clear_fault").success, TIMEOUT_S)
        assert call(rig, "enable").success
        here = cmd.position()
        cmd.send(3, (0.0, 0.0, 0.01))
        cmd.settle(here + [0.0, 0.0, 0.01])

        sdk_lines = int(arm_values(rig)["sdk_log_lines"])
        out, err = capfd.readouterr()
    print(f"stderr during the outage: {len(err)} bytes; piper_sdk lines captured: {sdk_lines}")
    # No line of piper_sdk's own; its failed frames at most quoted in one summary line.
    assert "[PIPER]" not in out + err and err.count("send failed") <= 1, err[-3000:]
    assert len(err) < 10_000, err[-3000:]  # our own few lines, not one per frame


@pytest.fixture
def ros_context(ros_domain):
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain)
    yield context, ros_domain
    rclpy.shutdown(context=context)


def test_a_missing_interface_at_start_is_retried_with_back_off_quietly(ros_context, tmp_path):
    context, domain = ros_context
    channel = f"heisd-nocan{os.getpid() % 10000}"  # no machine has it (<= 15 characters)
    proc = DriverProcess(tmp_path, domain, {
        "interface": "socketcan",
        "can_channel": channel,
        "diagnostics_period_s": 0.1,
        "reconnect_period_s": 0.25,
        "reconnect_max_period_s": 1.0,
    }, name="nocan_piper_driver", prefix="/nocan")
    drv = Driver(context, proc)
    try:
        # Until five attempts (0, 0.25, 0.75, 1.75, 2.75 s) as the driver counts them, or, in
        # a driver that does not count them, as piper_sdk printed them (a line each).
        assert drv.wait_for(lambda: int(drv.value("arm", "connect_attempts") or 0) >= 5
                            or proc.text().count("[PIPER]") >= 5), proc.text()[-3000:]
        text = proc.text()
        print(f"node output after {drv.value('arm', 'connect_attempts')} attempts: "
              f"{len(text)} bytes")
        assert "[PIPER]" not in text, text[-3000:]
        # Our own line with the SDK's reason, once, and the capture's summary (one per 10 s).
        assert text.count("cannot connect to the PIPER") == 1, text[-3000:]
        assert text.count("piper_sdk logged") == 1, text[-3000:]
        assert len(text.splitlines()) <= 3, text[-3000:]
        assert len(text) < 3000, text[-3000:]
        arm, values = drv.diag("arm")
        assert f"CAN socket {channel} does not exist" in arm.message, arm.message
        assert values["connected"] == "False" and int(values["sdk_log_lines"]) >= 5
        assert proc.proc.poll() is None
    finally:
        drv.close()
        code = proc.stop()
    assert code == 0, proc.text()[-3000:]

