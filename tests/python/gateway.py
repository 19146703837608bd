"""Starting `ringmaster serve` for the Python tests: the binary from RINGMASTER_BIN (tests/run
builds it), a free loopback port, the given config, and a stop at the end."""

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest


def binary():
    path = os.environ.get("RINGMASTER_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("RINGMASTER_BIN must point at a built ringmaster binary (tests/run sets it)")
    return path


# Two simulated servers on a fast modelled clock: the fleet every Python test serves from.
SIMULATED_FLEET = """
[simulator]
time_scale = 0.01
[[servers]]
address = "sim://gpu-0"
[[servers]]
address = "sim://gpu-1"
"""


def fake_upstream_binary():
    """The tests' fake OpenAI-compatible server, built beside the gateway binary."""
    path = os.path.join(os.path.dirname(binary()), "fake-upstream")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: tests/run builds it with the workspace")
    return path


@contextlib.contextmanager
def fake_upstream(behavior):
    """A fake OpenAI-compatible server answering with `behavior` (see tests/fake_upstream.rs);
    yields its base URL once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen(
        [fake_upstream_binary(), "--listen", f"127.0.0.1:{port}", "--behavior", behavior],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"the fake upstream ({behavior}) did not start")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def wait_healthy(proc, url, timeout=30, context=None):
    """Waits until `url`/healthz answers 200: True; False as soon as `proc` exits or after
    `timeout` seconds. The one loop every test that starts a gateway of its own waits in."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1, context=context) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.05)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(config, args=(), ca_file=None):
    """A gateway serving `config` (TOML without `listen`), with the extra command-line `args`
    (`--cluster URL`); yields its base URL once it answers /healthz, and fails the test with
    its log if it does not within 30 s. With `ca_file` the config serves HTTPS (`[tls]`) and
    the URL is `https://localhost:PORT`, checked against that CA."""
    port = free_port()
    context = None
    if ca_file:
        import ssl

        context = ssl.create_default_context(cafile=ca_file)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ringmaster.toml")
        with open(path, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\n{config}')
        log = open(os.path.join(tmp, "gateway.log"), "w+")
        proc = subprocess.Popen([binary(), "serve", "--config", path, *args], stdout=log, stderr=log)
        url = f"https://localhost:{port}" if ca_file else f"http://127.0.0.1:{port}"
        try:
            if not wait_healthy(proc, url, context=context):
                log.seek(0)
                pytest.fail("gateway did not start:\n" + log.read())
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()


@contextlib.contextmanager
def redis():
    """A `redis-server` of the test's own on a unix socket; yields its URL."""
    with tempfile.TemporaryDirectory() as tmp:
        socket_path = os.path.join(tmp, "redis.sock")
        proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", socket_path, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 10
            while not os.path.exists(socket_path):
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("redis-server did not start (tests/run installs it)")
                time.sleep(0.02)
            yield f"redis+unix://{socket_path}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
