"""A recording reverse proxy for the coding-agent tests: what an agent sends the gateway is
kept (path, the headers that matter, the body) and passed on; the gateway's answer comes
back as it came, streamed chunk by chunk. The requests are what the property test replays.

It can also rewrite what it passes on: `FreshBillingLine` gives each Messages request
Claude Code's billing line with a `cch=` of its own, as the interactive build sends it (the
pinned `claude -p` sends one line, the same on every request, which would let a gateway that
keeps the line find its cache anyway).
"""

import http.client
import http.server
import json
import random
import re
import threading

# Headers passed on besides the body's own.
PASSED = {"authorization", "x-api-key", "anthropic-version", "anthropic-beta", "content-type",
          "accept", "session-id", "x-claude-code-session-id", "x-client-request-id"}


BILLING_LINE = "x-anthropic-billing-header:"


class FreshBillingLine:
    """Rewrites a Messages body whose first system block is Claude Code's billing line so that
    the line's `cch=` is new (replaced, or added where the line has none): what the
    interactive build sends on every request. Bodies without the line pass unchanged; the
    lines written are kept, in order, so a test can check that they were written and differ."""

    def __init__(self, seed=None):
        self.rng = random.Random(seed)
        self.lines = []

    def __call__(self, path, body):
        if not path.startswith("/v1/messages") or not body:
            return body
        value = json.loads(body)
        system = value.get("system")
        if not (isinstance(system, list) and system and isinstance(system[0], dict)):
            return body
        text = system[0].get("text")
        if system[0].get("type") != "text" or not isinstance(text, str) or not text.startswith(BILLING_LINE):
            return body
        while True:
            cch = f"{self.rng.getrandbits(20):05x}"
            line = re.sub(r"\s*cch=[0-9a-fA-F]*;", "", text).rstrip() + f" cch={cch};"
            # New on every request: a repeat would hand a gateway that keeps the line a hit.
            if line not in self.lines:
                break
        self.lines.append(line)
        system[0]["text"] = line
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class CaptureProxy:
    """A proxy on a free loopback port in front of `upstream` (`127.0.0.1:PORT`); `rewrite`
    (path, body) -> body, if given, changes each request's body before it is kept and sent."""

    def __init__(self, upstream_port, rewrite=None):
        self.captured = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.forward(b"")

            def do_DELETE(self):
                self.forward(b"")

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                self.forward(self.rfile.read(length))

            def forward(self, body):
                if rewrite is not None:
                    body = rewrite(self.path, body)
                headers = {k: v for k, v in self.headers.items() if k.lower() in PASSED}
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=300)
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                with proxy.lock:
                    proxy.captured.append({
                        "method": self.command,
                        "path": self.path,
                        "headers": headers,
                        "body": body.decode("utf-8", "replace"),
                        "status": reply.status,
                        "server": reply.getheader("x-ringmaster-server"),
                        "dropped": reply.getheader("x-ringmaster-dropped"),
                    })
                self.send_response(reply.status)
                for name, value in reply.getheaders():
                    if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                while True:
                    chunk = reply.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                conn.close()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def requests(self, path_prefix):
        """The captured POSTs to paths starting with `path_prefix`."""
        with self.lock:
            return [c for c in self.captured if c["method"] == "POST" and c["path"].startswith(path_prefix)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def dump(self, path):
        with self.lock:
            with open(path, "w") as f:
                json.dump(self.captured, f)
