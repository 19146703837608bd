"""Stopping `ringmaster serve` from outside, as an operator or an orchestrator does: the first
SIGINT or SIGTERM drains (a streamed request in flight runs to its end within the grace
period), and a second one during the drain ends the process at once, saying so in the log."""

import contextlib
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time

import pytest

from gateway import binary, free_port, wait_healthy

# One simulated server whose decode steps take 50 ms: a request of N output tokens streams
# for about N / 20 seconds. The grace period is far longer than any wait below, so a process
# that ends early was not waiting it out.
GRACE_S = 60
CONFIG = f"""
[limits]
shutdown_grace_seconds = {GRACE_S}
[simulator]
time_scale = 1.0
decode_step_base_ms = 50
[[servers]]
address = "sim://gpu-0"
"""


@contextlib.contextmanager
def serving():
    """A started gateway: (process, port, the path of its log)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "ringmaster.toml")
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\n{CONFIG}')
        log_path = os.path.join(tmp, "gateway.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([binary(), "serve", "--config", config], stdout=log, stderr=log,
                                    env=dict(os.environ, RUST_LOG="info"))
            try:
                if not wait_healthy(proc, f"http://127.0.0.1:{port}"):
                    pytest.fail("gateway did not start:\n" + open(log_path).read())
                yield proc, port, log_path
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)


def start_stream(port, max_tokens):
    """A streamed Messages request, in flight once this returns (its first event has come)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {
        "model": "sim-llama-3-8b",
        "max_tokens": max_tokens,
        "stream": True,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
    }
    conn.request("POST", "/v1/messages", body=json.dumps(body),
                 headers={"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    first = response.readline()
    assert first.startswith(b"event:"), first
    return conn, response


def rest_of(response):
    """What is left of a stream, to its end (or until the connection is cut)."""
    try:
        return response.read()
    except (http.client.IncompleteRead, ConnectionError) as e:
        return getattr(e, "partial", b"")


def wait_exit(proc, timeout):
    """The exit status and the seconds it took, or None if the process still runs."""
    started = time.time()
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.time() - started
    return status, time.time() - started


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_one_signal_drains_and_the_request_in_flight_ends_whole(sig):
    with serving() as (proc, port, log_path):
        # About 2 s of tokens.
        conn, response = start_stream(port, 40)
        started = time.time()
        proc.send_signal(sig)
        rest = rest_of(response)
        streamed_for = time.time() - started
        conn.close()
        assert b"message_stop" in rest, rest[-500:]
        status, _ = wait_exit(proc, 30)
        log = open(log_path).read()
        assert status == 0, log
        # It waited for the request (which still had about 2 s to go), not for the grace.
        assert streamed_for > 0.5, streamed_for
        assert "gateway.shutdown_requested" in log and "shutdown.forced" not in log, log


@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGTERM),
                                          (signal.SIGINT, signal.SIGINT),
                                          (signal.SIGTERM, signal.SIGINT)])
def test_a_second_signal_during_the_drain_stops_at_once(first, second):
    with serving() as (proc, port, log_path):
        # About 50 s of tokens: far past what this test waits.
        conn, response = start_stream(port, 1000)
        proc.send_signal(first)
        # Draining: the request in flight holds the process.
        status, _ = wait_exit(proc, 1.0)
        assert status is None, open(log_path).read()
        proc.send_signal(second)
        status, took = wait_exit(proc, 10)
        conn.close()
        log = open(log_path).read()
        assert status is not None and took < 5, log
        assert status == 128 + second, (status, log)
        assert "shutdown.forced" in log, log
        assert "gateway.draining" in log, log
