"""Slowloris, measured: N connections to a started gateway each send half a request head and
then nothing; how long until the gateway has closed every one, and whether a normal request is
served meanwhile. Run twice side by side, with the header read timeout off
(`header_read_timeout_ms = 0`, the gateway before [limits] had one) and at its default.

    python3 tests/bench/slowloris.py --bin target/debug/ringmaster [--connections 3000]
        [--observe 40] [--report FILE]

The gateway runs on core 1, this script on core 0 (taskset); both get an open-files limit
that fits the connections. Loopback only; every connection is closed at the end."""

import argparse
import os
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HALF_HEAD = b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: applica"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the gateway exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit("the gateway did not start listening")


def normal_request(port):
    body = (b'{"model":"sim","max_tokens":4,'
            b'"messages":[{"role":"user","content":"hello"}]}')
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/messages", data=body,
        headers={"content-type": "application/json"})
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
            return reply.status, time.monotonic() - began
    except urllib.error.HTTPError as e:
        return e.code, time.monotonic() - began
    except OSError as e:
        return f"failed: {e}", time.monotonic() - began


def one_run(binary, header_timeout_ms, connections, observe):
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ringmaster-slowloris-") as tmp:
        config = os.path.join(tmp, "gateway.toml")
        with open(config, "w") as f:
            f.write('models = ["sim"]\n[simulator]\ntime_scale = 0.01\n'
                    f"[limits]\nheader_read_timeout_ms = {header_timeout_ms}\n"
                    '[[servers]]\naddress = "sim://gpu-0"\n')
        gateway = subprocess.Popen(
            ["taskset", "-c", "1", binary, "serve", "-c", config, "--listen",
             f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"})
        try:
            wait_listening(port, gateway)
            selector = selectors.DefaultSelector()
            opened_at = {}
            began = time.monotonic()
            for _ in range(connections):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(HALF_HEAD)
                s.setblocking(False)
                selector.register(s, selectors.EVENT_READ)
                opened_at[s] = time.monotonic()
            opened = time.monotonic() - began
            status, latency = normal_request(port)
            closed = []
            deadline = began + observe
            while opened_at and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.5):
                    s = key.fileobj
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    if not data or data.startswith(b"HTTP/1.1 408"):
                        closed.append(time.monotonic() - opened_at.pop(s))
                        selector.unregister(s)
                        s.close()
            held = len(opened_at)
            for s in list(opened_at):
                selector.unregister(s)
                s.close()
            return {
                "timeout": f"{header_timeout_ms} ms" if header_timeout_ms else "off",
                "connections": connections,
                "opened_s": opened,
                "closed": len(closed),
                "held": held,
                "last_closed_s": max(closed) if closed else None,
                "observed_s": observe,
                "normal": status,
                "normal_s": latency,
            }
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True)
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--observe", type=float, default=40.0,
                        help="seconds to wait for the gateway to close them")
    parser.add_argument("--report")
    args = parser.parse_args()
    want = args.connections + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    os.sched_setaffinity(0, {0})
    rows = [one_run(args.bin, 0, args.connections, args.observe),
            one_run(args.bin, 10_000, args.connections, args.observe)]
    lines = ["| header read timeout | connections | closed by the gateway | still held at "
             f"{args.observe:.0f} s | last closed after | a normal request meanwhile |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        last = f"{r['last_closed_s']:.1f} s" if r["last_closed_s"] is not None else "-"
        lines.append(f"| {r['timeout']} | {r['connections']} | {r['closed']} | {r['held']} | "
                     f"{last} | {r['normal']} in {r['normal_s'] * 1000:.0f} ms |")
    table = "\n".join(lines)
    print(table)
    if args.report:
        with open(args.report, "w") as f:
            f.write(table + "\n")
    on = rows[1]
    if on["held"] or on["normal"] != 200:
        sys.exit("with the default header read timeout, connections were still held or a "
                 "normal request was not served")


if __name__ == "__main__":
    main()
