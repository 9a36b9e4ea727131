"""Child processes for the Python tests that run carpool's binaries (client/python/tests and
tests/http): waiting for a line in a log, and stopping a process without leaving it behind."""

import re
import signal
import subprocess
import time


def wait_for_log(path, pattern, timeout):
    """The first match of `pattern` in the file at `path`, polled until `timeout` seconds pass;
    None then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        time.sleep(0.05)
    return None


def stop(proc, timeout=10):
    """SIGTERM, then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
