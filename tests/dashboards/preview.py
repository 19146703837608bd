#!/usr/bin/env python3
"""Draws the Grafana dashboard's panels from real data, for the README's picture (not part of
tests/run; Grafana itself is not available on this project's machines).

It starts the gateway exactly as check.py does (every series the dashboard reads has samples),
Debian's Prometheus scraping it every 2 s, and traffic on both doors for --seconds; then serves
tests/dashboards/preview/ (which runs every panel's queries through Prometheus's HTTP API and
lays the panels out as the dashboard does, with uPlot) and keeps a screenshot taken in headless
Chromium by playwright-core (tests/ui's; run `npm ci` there first).

  python3 tests/dashboards/preview.py [--binary PATH] [--seconds 150] [--out docs/images/dashboard.png]
"""
import argparse
import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402  (the same gateway, config and traffic as the check)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def start_prometheus(workdir, target):
    port = check.free_port()
    config = Path(workdir) / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n"
        f"rule_files: ['{REPO / 'examples/grafana/alerts.yml'}']\n"
        "scrape_configs:\n  - job_name: ringmaster\n    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={Path(workdir) / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(Path(workdir) / "prometheus.log", "wb"),
        start_new_session=True, preexec_fn=check.die_with_parent,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise check.CheckError("prometheus did not start; see its log in " + str(workdir))


def traffic(gateway, seconds):
    """Steady mixed traffic, with bursts, on both doors and both variants."""
    # (check.drive's guardrail has stopped the candidate by now: its weight is 0.)
    auth = {"x-api-key": check.KEY}
    end = time.time() + seconds

    def one(i):
        session = {**auth, "x-session-id": f"s{i % 40}"}
        body = check.messages_body(check.random_prompt(random.choice([40, 200, 800])), stream=i % 3 == 0)
        path = "/v1/messages"
        if i % 2:
            body, path = check.chat_body(check.random_prompt(120), stream=i % 4 == 1), "/v1/chat/completions"
        if i % 50 == 0:
            gateway.request("POST", "/v1/messages", check.messages_body("hi"), {"x-api-key": check.LIMITED_KEY})
        try:
            gateway.request("POST", path, body, session)
        except OSError:
            pass

    i = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        while time.time() < end:
            burst = 16 if int(time.time()) % 20 < 5 else 4
            list(pool.map(one, range(i, i + burst)))
            i += burst
            time.sleep(0.05)
    return i


def serve(prometheus_port, dashboard):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/api/"):
                with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}{self.path}", timeout=30) as r:
                    body = r.read()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)
                return
            files = {
                "/": HERE / "preview/index.html",
                "/preview.js": HERE / "preview/preview.js",
                "/dashboard.json": Path(dashboard),
                "/uPlot.iife.min.js": REPO / "host/admin/ui/vendor/uPlot.iife.min.js",
                "/uPlot.min.css": REPO / "host/admin/ui/vendor/uPlot.min.css",
            }
            path = files.get(self.path.split("?")[0])
            if path is None:
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            kind = {".js": "text/javascript", ".css": "text/css", ".json": "application/json"}.get(path.suffix, "text/html")
            self.send_header("content-type", kind)
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=check.default_binary())
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--dashboard", default=str(REPO / "examples/grafana/ringmaster.json"))
    parser.add_argument("--out", default=str(REPO / "docs/images/dashboard.png"))
    args = parser.parse_args()
    for tool in ("prometheus", "node"):
        if shutil.which(tool) is None:
            raise check.CheckError(f"{tool} is not installed")
    with tempfile.TemporaryDirectory(prefix="ringmaster-preview-") as workdir:
        gateway = check.Gateway(args.binary, workdir)
        gateway.start()
        prometheus = None
        try:
            prometheus, port = start_prometheus(workdir, f"127.0.0.1:{gateway.port}")
            check.log("driving the features once (guardrails, refusals, faults) ...")
            check.drive(gateway)
            check.log(f"steady traffic for {args.seconds} s ...")
            sent = traffic(gateway, args.seconds)
            check.log(f"  {sent} requests")
            server = serve(port, args.dashboard)
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            subprocess.run(["node", str(HERE / "preview/shoot.mjs"), url, args.out], check=True)
            server.shutdown()
            check.log(f"wrote {args.out}")
        finally:
            if prometheus is not None:
                prometheus.kill()
            gateway.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except check.CheckError as e:
        check.log(f"FAIL: {e}")
        sys.exit(2)
