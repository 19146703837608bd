"""The soak: a gateway under steady mixed load on both doors for a bounded time, while its
router policy is swapped every few seconds, servers join and leave, and faults are injected
into its remote servers; at the end it must have lost nothing it cannot explain and leaked
nothing. Run by tests/soak.sh (which says how); a results table goes to stdout and --report.

What it asserts:
- every failed request is explained by an injected fault (it overlapped the fault's window and
  its error is a server's failure), counted by cause; any other failure fails the soak;
- resident memory after warm-up stays flat: the mean of the last quarter's samples is at most
  the warm-up's peak times RSS_GROWTH plus RSS_SLACK_MIB;
- no KV blocks are held once the load has stopped (every simulated server's used blocks 0);
- policy instances alive in the pooling allocator at the end are no more than after warm-up
  plus one version's warm pool (a swap that leaked its instances would grow them each time);
- client connections return to what the scraper itself holds, and the gateway's open file
  descriptors to the warm-up count plus FD_SLACK.

The load comes from the official Anthropic and OpenAI SDKs (retries off, so every failure is
seen), a fixed number of workers each sending one request after another."""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import anthropic
import openai

ADMIN_TOKEN = "soak-admin-token-0123456789"
# The growth bound: a flat process may still grow by its caches' fill (the prefix index, the
# recent errors ring, histogram buckets) and the allocator's retention.
RSS_GROWTH = 1.10
RSS_SLACK_MIB = 24
FD_SLACK = 16
# A failure counts against a fault that began before it ended and ended less than this before
# it began: ejection and the retry deadline take that long to route around a dead server.
FAULT_GRACE_S = 3.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, what, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"soak: {what} did not start")
            time.sleep(0.05)


class Fake:
    """A fake OpenAI-compatible server process (tests/fake_upstream.rs), paced like a decode."""

    def __init__(self, binary, cpu):
        self.binary, self.cpu = binary, cpu
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["taskset", "-c", self.cpu, self.binary, "--listen", f"127.0.0.1:{self.port}",
             "--behavior", "paced", "--tokens", "20"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.port, self.proc, "a fake server")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self):
        self.proc.send_signal(signal.SIGCONT)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"


def proc_status(pid):
    rss, fds = None, None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return rss, fds


def admin(base, method, path, body=None, content_type="application/json"):
    request = urllib.request.Request(base + path, method=method, data=body)
    request.add_header("x-admin-token", ADMIN_TOKEN)
    if body is not None:
        request.add_header("content-type", content_type)
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.read()


def metric(text, name, labels=""):
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name and labels in series:
            total += float(value)
    return total


class Run:
    def __init__(self):
        self.sent = 0
        self.succeeded = 0
        self.by_door = {}
        self.failures = []  # (start, end, door, cause text)
        self.faults = []  # (name, start, end)


async def one_request(run, i, messages_client, openai_client):
    door = ["messages", "messages-stream", "chat", "chat-stream"][i % 4]
    model = "fake" if i % 3 == 0 else "sim-llama-3-8b"
    prompt = f"soak request {i}: " + "a shared system prompt for the prefix cache. " * (i % 5)
    started = time.time()
    run.sent += 1
    run.by_door[door] = run.by_door.get(door, 0) + 1
    try:
        if door == "messages":
            reply = await messages_client.messages.create(
                model=model, max_tokens=16, messages=[{"role": "user", "content": prompt}])
            ok = reply.type == "message" and reply.stop_reason is not None
        elif door == "messages-stream":
            stopped = False
            async with messages_client.messages.stream(
                    model=model, max_tokens=16,
                    messages=[{"role": "user", "content": prompt}]) as stream:
                async for event in stream:
                    if event.type == "message_stop":
                        stopped = True
            ok = stopped
        elif door == "chat":
            reply = await openai_client.chat.completions.create(
                model=model, max_tokens=16, messages=[{"role": "user", "content": prompt}])
            ok = reply.choices[0].finish_reason is not None
        else:
            finished = False
            stream = await openai_client.chat.completions.create(
                model=model, max_tokens=16, stream=True,
                messages=[{"role": "user", "content": prompt}])
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finished = True
            ok = finished
        if ok:
            run.succeeded += 1
        else:
            run.failures.append((started, time.time(), door, "incomplete answer"))
    except (anthropic.APIError, openai.APIError) as e:
        run.failures.append((started, time.time(), door, f"{type(e).__name__}: {e}"[:300]))


async def worker(run, w, until, base):
    messages_client = anthropic.AsyncAnthropic(
        base_url=base, api_key="soak", max_retries=0, timeout=60)
    openai_client = openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="soak", max_retries=0, timeout=60)
    i = w
    while time.time() < until:
        await one_request(run, i, messages_client, openai_client)
        i += 1000
    await messages_client.close()
    await openai_client.close()


async def chaos(run, until, base, fakes, components):
    """Swaps the router every 5 s, adds and drains a server every 7 s, and every 15 s kills
    one fake server (restarted 3 s later) or hangs the other (for 3 s)."""
    started = time.time()
    next_swap, next_join, next_fault = started + 5, started + 7, started + 10
    added, swaps, joins, n_fault = [], 0, 0, 0
    loop = asyncio.get_running_loop()

    def call(*args):
        return loop.run_in_executor(None, lambda: admin(base, *args))

    while time.time() < until - 3:
        now = time.time()
        if now >= next_swap:
            bytes_ = components[swaps % len(components)]
            status, _ = await call("PUT", "/admin/policies/router?variant=default", bytes_,
                                   "application/wasm")
            assert status == 200, status
            swaps += 1
            next_swap = now + 5
        if now >= next_join:
            joins += 1
            name = f"sim://soak-{joins}"
            status, body = await call("POST", "/admin/servers",
                                      json.dumps({"address": name}).encode())
            assert status in (200, 201), (status, body)
            added.append(json.loads(body).get("id", f"soak-{joins}"))
            if len(added) > 2:
                old = added.pop(0)
                status, _ = await call("DELETE", f"/admin/servers/{old}")
                assert status == 200, status
            next_join = now + 7
        if now >= next_fault:
            fake = fakes[n_fault % 2]
            begin = time.time()
            if n_fault % 2 == 0:
                fake.kill()
                await asyncio.sleep(3)
                fake.start()
                name = "server killed (SIGKILL), restarted after 3 s"
            else:
                fake.stop()
                await asyncio.sleep(3)
                fake.cont()
                name = "server hung (SIGSTOP) for 3 s"
            run.faults.append((name, begin, time.time()))
            n_fault += 1
            next_fault = time.time() + 15
        await asyncio.sleep(0.2)
    return swaps, joins


def explain(run, failure):
    start, end, _, text = failure
    for name, f_start, f_end in run.faults:
        if start <= f_end + FAULT_GRACE_S and end >= f_start:
            upstream = any(k in text for k in (
                "overloaded", "GPU server", "server at", "broke off", "api_error",
                "Internal", "Connection", "incomplete"))
            if upstream:
                return name
    return None


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--fake", required=True)
    ap.add_argument("--components", required=True)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--report")
    args = ap.parse_args()

    cpu_count = os.cpu_count() or 1
    gateway_cpu = "1" if cpu_count > 1 else "0"
    load_cpu = "0"
    fakes = [Fake(args.fake, load_cpu), Fake(args.fake, load_cpu)]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="ringmaster-soak-") as tmp:
        config = os.path.join(tmp, "soak.toml")
        with open(config, "w") as f:
            f.write(f'admin_token = "{ADMIN_TOKEN}"\nmodels = ["fake", "sim-llama-3-8b"]\n'
                    "[simulator]\ntime_scale = 0.05\n"
                    "[upstream]\nconnect_timeout_ms = 500\nfirst_byte_timeout_ms = 2000\n"
                    "chunk_gap_timeout_ms = 1000\neject_after_failures = 1\neject_base_ms = 500\n"
                    "eject_max_ms = 2000\n[retry]\nattempts = 3\ndeadline_ms = 10000\n")
            for i in range(3):
                f.write(f'[[servers]]\naddress = "sim://gpu-{i}"\n')
            for fake in fakes:
                f.write(f'[[servers]]\naddress = "{fake.url}"\n')
        log = open(os.path.join(tmp, "gateway.log"), "w")
        gateway = subprocess.Popen(
            ["taskset", "-c", gateway_cpu, args.bin, "serve", "-c", config, "--listen",
             f"127.0.0.1:{port}"],
            stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "warn"})
        wait_listening(port, gateway, "the gateway")
        components = []
        for name in ("consistent-hash", "prefix-affinity", "cache-aware"):
            with open(os.path.join(args.components, f"{name}.wasm"), "rb") as f:
                components.append(f.read())
        run = Run()
        samples = []  # (t, rss, fds)
        began = time.time()
        until = began + args.seconds
        warmup_end = began + max(10, args.seconds * 0.2)

        async def sampler():
            while time.time() < until:
                rss, fds = proc_status(gateway.pid)
                samples.append((time.time(), rss, fds))
                await asyncio.sleep(2)

        warm_metrics = {}

        async def warm_snapshot():
            await asyncio.sleep(warmup_end - time.time())
            loop = asyncio.get_running_loop()
            _, text = await loop.run_in_executor(None, lambda: admin(base, "GET", "/metrics"))
            warm_metrics["text"] = text.decode()

        tasks = [worker(run, w, until, base) for w in range(args.workers)]
        tasks += [sampler(), warm_snapshot()]
        chaos_task = asyncio.ensure_future(chaos(run, until, base, fakes, components))
        await asyncio.gather(*tasks)
        swaps, joins = await chaos_task
        # The load has stopped: let drains and streams finish, then look for leaks.
        await asyncio.sleep(3)
        _, end_metrics = admin(base, "GET", "/metrics")
        end_metrics = end_metrics.decode()
        _, servers = admin(base, "GET", "/admin/servers")
        servers = json.loads(servers)["servers"]
        rss_end, fds_end = proc_status(gateway.pid)
        gateway.send_signal(signal.SIGTERM)
        try:
            gateway.wait(timeout=40)
        except subprocess.TimeoutExpired:
            gateway.kill()
        for fake in fakes:
            fake.cont()
            fake.kill()
        log.close()
        with open(os.path.join(tmp, "gateway.log")) as f:
            gateway_log = f.read()

    problems = []
    causes, unexplained = {}, []
    for failure in run.failures:
        cause = explain(run, failure)
        if cause is None:
            unexplained.append(failure)
        else:
            causes[cause] = causes.get(cause, 0) + 1
    if unexplained:
        problems.append(f"{len(unexplained)} failures no fault explains, e.g. "
                        f"{[u[2] + ': ' + u[3] for u in unexplained[:3]]}")
    warm = [s for s in samples if s[0] <= warmup_end and s[1]]
    after = [s for s in samples if s[0] > warmup_end and s[1]]
    last_quarter = after[len(after) * 3 // 4:] or after[-1:]
    rss_start = samples[0][1] if samples else None
    rss_warm_peak = max(s[1] for s in warm) if warm else None
    rss_tail = statistics.mean(s[1] for s in last_quarter) if last_quarter else None
    rss_bound = rss_warm_peak * RSS_GROWTH + RSS_SLACK_MIB * 2**20 if rss_warm_peak else None
    if rss_tail is None or rss_bound is None or rss_tail > rss_bound:
        problems.append(f"resident memory grew: last quarter mean {rss_tail} > bound {rss_bound}")
    fds_warm = max(s[2] for s in warm if s[2]) if warm else None
    if fds_warm is None or fds_end is None or fds_end > fds_warm + FD_SLACK:
        problems.append(f"file descriptors leaked: {fds_end} at the end, {fds_warm} after warm-up")
    held = {s["id"]: s["engine"]["kv_blocks_used"] for s in servers
            if s["address"].startswith("sim://")}
    if any(held.values()):
        problems.append(f"KV blocks still held after the load stopped: {held}")
    inst_warm = metric(warm_metrics.get("text", ""), "ringmaster_policy_instances")
    inst_end = metric(end_metrics, "ringmaster_policy_instances")
    if inst_end > inst_warm + 16:
        problems.append(f"policy instances grew: {inst_warm:.0f} after warm-up, {inst_end:.0f} at the end")
    conns_end = metric(end_metrics, "ringmaster_client_connections")
    if conns_end > 2:
        problems.append(f"client connections left open: {conns_end:.0f}")
    if run.succeeded == 0 or len(run.faults) == 0 and args.seconds >= 30:
        problems.append("the soak ran no load or no fault")
    if "panicked" in gateway_log:
        problems.append("the gateway panicked: " + gateway_log[gateway_log.index("panicked") - 200:][:600])

    mib = lambda b: f"{b / 2**20:.1f} MiB" if b else "?"
    lines = [
        f"| soak ({args.seconds} s, {args.workers} workers, both doors, plain and streamed) | value |",
        "| --- | --- |",
        f"| requests sent | {run.sent} ({', '.join(f'{k} {v}' for k, v in sorted(run.by_door.items()))}) |",
        f"| succeeded | {run.succeeded} |",
        f"| failed, explained by an injected fault | {sum(causes.values())} |",
    ]
    for cause, n in sorted(causes.items()):
        lines.append(f"| &nbsp;&nbsp;{cause} | {n} |")
    lines += [
        f"| failed, unexplained | {len(unexplained)} |",
        f"| faults injected | {len(run.faults)} ({', '.join(sorted(set(f[0] for f in run.faults)))}) |",
        f"| router swaps / servers joined (each then drained) | {swaps} / {joins} |",
        f"| resident memory: at the start / after warm-up (peak) / last quarter (mean) / at the end | "
        f"{mib(rss_start)} / {mib(rss_warm_peak)} / {mib(rss_tail)} / {mib(rss_end)} "
        f"(bound {mib(rss_bound)}) |",
        f"| open file descriptors: after warm-up / at the end | {fds_warm} / {fds_end} |",
        f"| policy instances: after warm-up / at the end | {inst_warm:.0f} / {inst_end:.0f} |",
        f"| KV blocks held after the load stopped | {sum(held.values())} |",
        f"| client connections open at the end | {conns_end:.0f} |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.report:
        with open(args.report, "w") as f:
            f.write(table + "\n")
    if problems:
        for p in problems:
            print("soak: FAILED:", p, file=sys.stderr)
        sys.exit(1)
    print("soak: OK")


if __name__ == "__main__":
    asyncio.run(main())
