#!/usr/bin/env python3
"""Checks the operator dashboard and alert rules in examples/grafana/ against a running gateway.

It starts `ringmaster serve` on a free loopback port with a temporary config (two simulated
servers on a fast clock, two router variants with the guardrails on, an admission policy, a
safety filter that faults on demand, and a tenant with a tiny rate limit), drives enough
traffic that every family the dashboard reads has samples (a guardrail stop and a policy fault
among them), then reads `/metrics` and fails if:

* a metric name referenced by a dashboard panel, a template variable, an alert rule or an
  alert unit test is not exported (histograms provide `_bucket`, `_sum`, `_count`; counters
  are exported as `_total`);
* a label used in a `{label=...}` matcher, a `by (...)`/`without (...)` clause or a
  `label_values()` query is not on that metric's samples (a warning only where the metric
  has no samples yet; `job` and `instance` are Prometheus's target labels and are exempt);
* `promtool check rules` or `promtool test rules` fails.

Python 3 standard library only. Usage:

    python3 tests/dashboards/check.py [--binary PATH] [--promtool PATH] [--dump-metrics FILE]

The binary defaults to $RINGMASTER_BIN, else $CARGO_TARGET_DIR/debug/ringmaster, else
target/debug/ringmaster in the checkout. Exit status 0 when everything holds, 1 when a check
fails, 2 when the check could not run (no binary, the gateway would not start, no promtool).
"""

import argparse
import difflib
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "examples" / "grafana"
FIXTURE_FILTER = REPO / "policies" / "dist" / "fixtures" / "filter-faults-on-demand.wasm"

ADMIN_TOKEN = "dashboards-check-admin-token-0123456789"
KEY = "sk-dashboards-check-main-0123456789"
LIMITED_KEY = "sk-dashboards-check-limited-0123456789"
MODEL = "sim-llama-3-8b"

# Labels Prometheus adds when it scrapes (never in /metrics itself).
TARGET_LABELS = {"job", "instance"}

# The gateway under test. Prefill is slowed (the simulator's clock runs 100 times faster, so a
# prompt of ~1000 tokens takes ~100 ms) so that the candidate variant, sent only long prompts,
# is slower than the control beyond doubt and the guardrails stop it.
CONFIG = """\
listen = "127.0.0.1:{port}"
admin_token = "{admin_token}"

[limits]
rate_limit_delay_ms = 0

[[tenants]]
name = "dashboards-check"

[[tenants]]
name = "limited"
requests_per_minute = 2

[[api_keys]]
key = "{key}"
tenant = "dashboards-check"

[[api_keys]]
key = "{limited_key}"
tenant = "limited"

[policies]
guardrails = true

[[policies.router]]
name = "control"
source = "builtin:prefix-affinity"
weight = 50

[[policies.router]]
name = "candidate"
source = "builtin:round-robin"
weight = 50

[policies.admission]
source = "builtin:tiered"

[policies.safety]
source = {safety_filter}

[[servers]]
address = "sim://gpu-0"

[[servers]]
address = "sim://gpu-1"

[simulator]
time_scale = 0.01
prefill_tokens_per_s = 100
"""

HTTP_TIMEOUT = 30
STARTUP_TIMEOUT = 90
GUARDRAIL_TIMEOUT = 75


class CheckError(Exception):
    """The check could not run (exit status 2)."""


def log(message=""):
    print(message, flush=True)


# --------------------------------------------------------------------------------------------
# The files under test
# --------------------------------------------------------------------------------------------


def iter_panels(panels):
    for panel in panels or []:
        yield panel
        # A collapsed row holds its panels.
        yield from iter_panels(panel.get("panels"))


def dashboard_queries(dashboard):
    """(where, expr) of every panel target, and (where, query) of every query variable."""
    queries = []
    for panel in iter_panels(dashboard.get("panels")):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if expr:
                where = f"panel {panel.get('id')} \"{panel.get('title')}\" target {target.get('refId')}"
                queries.append((where, expr))
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if query:
            queries.append((f"variable ${var.get('name')}", query))
    return queries


def dashboard_sanity(dashboard):
    """Structural problems a Grafana import would trip over or an operator would notice."""
    problems = []
    ids = {}
    for panel in iter_panels(dashboard.get("panels")):
        pid = panel.get("id")
        if pid in ids:
            problems.append(f"panel id {pid} used by \"{ids[pid]}\" and \"{panel.get('title')}\"")
        ids[pid] = panel.get("title")
        if "gridPos" not in panel:
            problems.append(f"panel {pid} \"{panel.get('title')}\" has no gridPos")
        if panel.get("type") == "row":
            continue
        if not panel.get("title"):
            problems.append(f"panel {pid} has no title")
        if not panel.get("description"):
            problems.append(f"panel {pid} \"{panel.get('title')}\" has no description")
        if not panel.get("targets"):
            problems.append(f"panel {pid} \"{panel.get('title')}\" has no query")
        for target in panel.get("targets") or []:
            uid = (target.get("datasource") or panel.get("datasource") or {}).get("uid")
            if uid != "${datasource}":
                problems.append(
                    f"panel {pid} \"{panel.get('title')}\" target {target.get('refId')} "
                    f"does not use the ${{datasource}} variable (uid {uid!r})"
                )
    names = [v.get("name") for v in (dashboard.get("templating") or {}).get("list") or []]
    if "datasource" not in names:
        problems.append("no `datasource` template variable")
    return problems


def yaml_exprs(path):
    """(where, expr) of every `expr:` in a Prometheus rules file, and (where, series) of every
    `series:`/`expr:` in a promtool test file: plain, quoted, and `|`/`>` block scalars (the
    shapes these files use), without a YAML library."""
    lines = path.read_text().splitlines()
    found = []
    i = 0
    current = None
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-?\s*(alert|record):\s*(.+?)\s*$", line)
        if m:
            current = m.group(2).strip("'\"")
        m = re.match(r"^(\s*)(?:-\s+)?(expr|series):\s*(.*?)\s*$", line)
        if not m:
            i += 1
            continue
        indent, key, value = len(m.group(1)), m.group(2), m.group(3)
        where = f"{path.name}:{i + 1} {key}" + (f" ({current})" if current else "")
        if value[:1] in ("|", ">"):
            block = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i].strip())
                i += 1
            found.append((where, "\n".join(block).strip()))
            continue
        if value[:1] in ("'", '"'):
            quote = value[0]
            value = value[1:-1] if value.endswith(quote) and len(value) > 1 else value[1:]
            if quote == "'":
                value = value.replace("''", "'")
            else:
                value = value.replace('\\"', '"')
        found.append((where, value))
        i += 1
    return found


# --------------------------------------------------------------------------------------------
# PromQL, as far as names and labels go
# --------------------------------------------------------------------------------------------

NAME_RE = re.compile(r"(?<![A-Za-z0-9_:$.])(ringmaster_[A-Za-z0-9_:]*)")
STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
MATCHER_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
GROUPING_RE = re.compile(r"\b(by|without|on|ignoring)\s*\(([^()]*)\)")
LABEL_VALUES_RE = re.compile(r"label_values\(\s*(.*)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def blank_strings(expr):
    """The expression with every string literal's contents replaced by spaces (same length)."""
    return STRING_RE.sub(lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[-1], expr)


def matching_paren(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def opening_paren(text, close_at):
    depth = 0
    for i in range(close_at, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return None


def metric_names(expr):
    return NAME_RE.findall(blank_strings(expr))


def label_uses(expr):
    """(label, [metric names it must be on], how) of every label the expression relies on."""
    uses = []
    # `label_values(selector, label)` of a Grafana variable.
    m = LABEL_VALUES_RE.match(expr.strip())
    if m:
        names = metric_names(m.group(1))
        uses.append((m.group(2), names, "label_values"))
        expr = m.group(1)
    blanked = blank_strings(expr)
    # Matchers inside `metric{...}`.
    for sel in re.finditer(r"(ringmaster_[A-Za-z0-9_:]*)\s*\{([^}]*)\}", blanked):
        name, start = sel.group(1), sel.start(2)
        original = expr[start:sel.end(2)]
        for matcher in MATCHER_RE.finditer(original):
            uses.append((matcher.group(1), [name], f"matcher {matcher.group(1)}{matcher.group(2)}"))
    # Grouping clauses: by/without apply to the aggregation's argument, on/ignoring to the
    # whole binary expression (here: every ringmaster metric in the expression).
    for clause in GROUPING_RE.finditer(blanked):
        keyword = clause.group(1)
        labels = [l.strip() for l in clause.group(2).split(",") if l.strip()]
        if keyword in ("on", "ignoring"):
            scope = blanked
        else:
            after = clause.end()
            while after < len(blanked) and blanked[after].isspace():
                after += 1
            if after < len(blanked) and blanked[after] == "(":
                # `sum by (x) (argument)`
                end = matching_paren(blanked, after)
                scope = blanked[after:end + 1] if end is not None else blanked[after:]
            else:
                # `sum (argument) by (x)`
                before = clause.start() - 1
                while before >= 0 and blanked[before].isspace():
                    before -= 1
                start = opening_paren(blanked, before) if before >= 0 and blanked[before] == ")" else None
                scope = blanked[start:before + 1] if start is not None else blanked
        names = NAME_RE.findall(scope)
        for label in labels:
            uses.append((label, names, f"{keyword} ({label})"))
    return uses


# --------------------------------------------------------------------------------------------
# The exposition
# --------------------------------------------------------------------------------------------


def parse_exposition(text):
    """{series name: set of label names} for every sample, and {family: type} of every
    `# TYPE` line."""
    series = {}
    families = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                families[parts[2]] = parts[3]
            continue
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+\S+", line)
        if not m:
            continue
        labels = set()
        if m.group(3):
            for lm in MATCHER_RE.finditer(m.group(3)):
                labels.add(lm.group(1))
        series.setdefault(m.group(1), set()).update(labels)
    return series, families


def provided_names(series, families):
    """Every series name a query may use: the samples' names, and for families without samples
    the names their type gives (counter `foo`: `foo_total`; histogram `foo`: `foo_bucket`,
    `foo_sum`, `foo_count`; gauge: `foo`)."""
    names = set(series)
    for family, kind in families.items():
        names.update({
            "counter": [family if family.endswith("_total") else family + "_total"],
            "histogram": [family + "_bucket", family + "_sum", family + "_count"],
            "summary": [family, family + "_sum", family + "_count"],
        }.get(kind, [family]))
    return names


def hint_for(name, families, names):
    """Why a referenced name is missing, when it is a family's name used without its suffix."""
    kind = families.get(name)
    if kind == "counter":
        return f"a counter: query {name}_total"
    if kind == "histogram":
        return f"a histogram: query {name}_bucket, {name}_sum or {name}_count"
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.75)
    return f"similar exported names: {', '.join(close)}" if close else "no similar name is exported"


# --------------------------------------------------------------------------------------------
# The gateway
# --------------------------------------------------------------------------------------------


def default_binary():
    if os.environ.get("RINGMASTER_BIN"):
        return os.environ["RINGMASTER_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        return os.path.join(target, "debug", "ringmaster")
    return str(REPO / "target" / "debug" / "ringmaster")


# Loopback only: never through a proxy the environment may name.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """In the child before exec: on Linux, SIGKILL when the check dies, however it dies."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Gateway:
    def __init__(self, binary, workdir):
        self.binary = binary
        self.workdir = Path(workdir)
        self.proc = None
        self.port = None
        self.log_path = self.workdir / "gateway.log"
        self.log_file = None

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        for attempt in range(3):
            self.port = free_port()
            config = self.workdir / "ringmaster.toml"
            config.write_text(
                CONFIG.format(
                    port=self.port,
                    admin_token=ADMIN_TOKEN,
                    key=KEY,
                    limited_key=LIMITED_KEY,
                    safety_filter=json.dumps(str(FIXTURE_FILTER)),
                )
            )
            self.log_file = open(self.log_path, "ab")
            env = dict(os.environ)
            env.setdefault("RUST_LOG", "info")
            env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
            self.proc = subprocess.Popen(
                [self.binary, "serve", "--config", str(config)],
                stdout=self.log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(REPO),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            deadline = time.time() + STARTUP_TIMEOUT
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    status, _, body = self.request("GET", "/healthz", timeout=2)
                    if status == 200:
                        return
                except OSError:
                    pass
                time.sleep(0.1)
            exited = self.proc.poll()
            self.stop()
            if exited is not None and "address already in use" in self.log_tail().lower() and attempt < 2:
                continue
            reason = f"exited with status {exited}" if exited is not None else f"did not answer /healthz within {STARTUP_TIMEOUT} s"
            raise CheckError(f"the gateway {reason}; its log ends:\n{self.log_tail()}")

    def log_tail(self, lines=30):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=15)
        self.proc = None
        if self.log_file:
            self.log_file.close()
            self.log_file = None

    def request(self, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT):
        """(status, headers, body text); HTTP errors are answers, not exceptions."""
        data = None
        all_headers = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            all_headers.setdefault("content-type", "application/json")
        req = urllib.request.Request(self.base + path, data=data, headers=all_headers, method=method)
        try:
            with OPENER.open(req, timeout=timeout) as resp:
                return resp.status, resp.headers, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode(errors="replace")

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        if status != 200:
            raise CheckError(f"GET /metrics answered {status}: {body[:300]}")
        return body


def messages_body(content, stream=False):
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    return body


def chat_body(content, stream=False):
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def expect(status, wanted, what, body):
    if status != wanted:
        raise CheckError(f"{what} answered {status}, expected {wanted}: {body[:300]}")


def session_for(gateway, variant):
    """A session id the router slot sends to `variant` (asked of the explain endpoint, which
    runs nothing and counts nothing)."""
    for i in range(200):
        session = f"dashboards-{variant}-{i}"
        status, _, body = gateway.request(
            "POST",
            "/admin/route/explain",
            messages_body("hi"),
            {"x-admin-token": ADMIN_TOKEN, "x-session-id": session},
        )
        expect(status, 200, "POST /admin/route/explain", body)
        if json.loads(body).get("variant") == variant:
            return session
    raise CheckError(f"no session of 200 tried went to the router variant {variant!r}")


def random_prompt(chars):
    """Random words (no prefix shared with any other prompt, so nothing is cached)."""
    words = []
    length = 0
    while length < chars:
        word = "".join(random.choice(string.ascii_lowercase) for _ in range(random.randint(2, 9)))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def drive(gateway):
    """Traffic that gives every family the dashboard reads its samples. Returns notes."""
    notes = []
    auth = {"x-api-key": KEY}
    control = session_for(gateway, "control")
    candidate = session_for(gateway, "candidate")

    # The guardrails: short prompts on the control, long (slow to prefill) ones on the
    # candidate, until the candidate is stopped (the gateway looks every 5 s).
    log("  driving the guardrails: short prompts on `control`, long ones on `candidate` ...")
    started = time.time()
    stopped = False
    sent = 0
    while time.time() - started < GUARDRAIL_TIMEOUT:
        for _ in range(8):
            status, _, body = gateway.request("POST", "/v1/messages", messages_body("hi"), {**auth, "x-session-id": control})
            expect(status, 200, "POST /v1/messages (control)", body)
            status, headers, body = gateway.request(
                "POST", "/v1/messages", messages_body(random_prompt(4000)), {**auth, "x-session-id": candidate}
            )
            expect(status, 200, "POST /v1/messages (candidate)", body)
            sent += 2
        if re.search(r"^ringmaster_guardrail_stops_total\{", gateway.metrics(), re.M):
            stopped = True
            break
    if stopped:
        notes.append(f"guardrail stopped the candidate after {sent} requests, {time.time() - started:.1f} s")
    else:
        notes.append(f"the guardrails did not stop the candidate within {GUARDRAIL_TIMEOUT} s ({sent} requests)")

    # A handful on each door, whole and streamed.
    session = {**auth, "x-session-id": control}
    for stream in (False, True):
        status, _, body = gateway.request("POST", "/v1/messages", messages_body("hello there", stream), session)
        expect(status, 200, f"POST /v1/messages (stream={stream})", body)
        status, _, body = gateway.request("POST", "/v1/chat/completions", chat_body("hello there", stream), session)
        expect(status, 200, f"POST /v1/chat/completions (stream={stream})", body)
    status, _, body = gateway.request(
        "POST", "/v1/completions", {"model": MODEL, "max_tokens": 8, "prompt": "hello there"}, session
    )
    expect(status, 200, "POST /v1/completions", body)
    status, _, body = gateway.request(
        "POST", "/v1/chat/completions", chat_body("hello again"), {"authorization": f"Bearer {KEY}", "x-session-id": control}
    )
    expect(status, 200, "POST /v1/chat/completions (Bearer key)", body)
    # A safety-filter fault (the fixture traps on `chaos`; the filter fails open).
    status, _, body = gateway.request("POST", "/v1/messages", messages_body("chaos, please"), session)
    expect(status, 200, "POST /v1/messages (safety fault)", body)
    # Refusals: no key (401), and a tenant over its 2 requests a minute (429).
    status, _, body = gateway.request("POST", "/v1/messages", messages_body("hi"))
    expect(status, 401, "POST /v1/messages without a key", body)
    limited = [
        gateway.request("POST", "/v1/messages", messages_body("hi"), {"x-api-key": LIMITED_KEY, "x-session-id": control})[0]
        for _ in range(3)
    ]
    if 429 not in limited:
        raise CheckError(f"the limited tenant was never refused: {limited}")
    # A model that is not served (4xx), and the read-only endpoints.
    gateway.request("POST", "/v1/messages", {**messages_body("hi"), "model": "no-such-model"}, session)
    gateway.request("GET", "/v1/models", headers=auth)
    gateway.request("GET", "/readyz")
    return notes


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------


def check_queries(source, queries, series, families, names, errors, warnings):
    referenced = set()
    for where, expr in queries:
        for name in metric_names(expr):
            referenced.add(name)
            if name not in names:
                errors.append(f"{source}: {where}: `{name}` is not exported ({hint_for(name, families, names)})")
        for label, on, how in label_uses(expr):
            if label in TARGET_LABELS or label == "__name__":
                continue
            for name in on:
                if name not in names:
                    continue  # reported above
                if name not in series:
                    warnings.append(f"{source}: {where}: `{name}` has no samples yet; {how} not checked")
                    continue
                if label not in series[name]:
                    have = ", ".join(sorted(series[name])) or "none"
                    errors.append(f"{source}: {where}: {how}: `{name}` has no label `{label}` (its labels: {have})")
    return referenced


def run_promtool(promtool, args, errors):
    cmd = [promtool, *args]
    try:
        done = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        errors.append(f"`{' '.join(args)}` timed out")
        return None
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        errors.append(f"`promtool {' '.join(args)}` failed (status {done.returncode}):\n{output}")
    return output


GRAFANA_MACROS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def check_dashboard_promql(promtool, queries, errors):
    """Every panel query parses as PromQL: written as recording rules (Grafana's interval
    macros replaced by durations) for `promtool check rules`."""
    rules = []
    for i, (where, expr) in enumerate(queries):
        if expr.lstrip().startswith("label_values("):
            continue
        for macro, value in GRAFANA_MACROS.items():
            expr = expr.replace(macro, value)
        rules.append((where, expr))
    with tempfile.NamedTemporaryFile("w", suffix=".yml", prefix="dashboard-promql-", delete=False) as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (where, expr) in enumerate(rules):
            f.write(f"      - record: dashboard_check:query_{i}\n        expr: {json.dumps(expr)}\n")
        path = f.name
    try:
        done = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        errors.append("`promtool check rules` on the dashboard's queries timed out")
        return len(rules)
    finally:
        os.unlink(path)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        # Name each failing query by its panel.
        output = re.sub(
            r"dashboard_check:query_(\d+)\b",
            lambda m: f"{m.group(0)} [{rules[int(m.group(1))][0]}]" if int(m.group(1)) < len(rules) else m.group(0),
            output,
        )
        errors.append(f"dashboard queries that are not valid PromQL:\n{output}")
    return len(rules)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=default_binary(), help="the ringmaster binary (default: %(default)s)")
    parser.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool", help="promtool (default: %(default)s)")
    parser.add_argument("--dashboard", default=str(GRAFANA / "ringmaster.json"))
    parser.add_argument("--alerts", default=str(GRAFANA / "alerts.yml"))
    parser.add_argument("--alerts-test", default=str(GRAFANA / "alerts.test.yml"))
    parser.add_argument("--dump-metrics", metavar="FILE", help="also write the scraped /metrics here")
    parser.add_argument("--verbose", action="store_true", help="print warnings and every referenced name")
    args = parser.parse_args()

    for path in (args.dashboard, args.alerts, args.alerts_test):
        if not os.path.exists(path):
            raise CheckError(f"{path} does not exist")
    try:
        dashboard = json.loads(Path(args.dashboard).read_text())
    except json.JSONDecodeError as e:
        log(f"FAIL: {args.dashboard} is not valid JSON: {e}")
        return 1
    if not os.access(args.binary, os.X_OK):
        raise CheckError(
            f"no ringmaster binary at {args.binary}: build it (`cargo build -p ringmaster`) or pass --binary"
        )
    if not os.access(args.promtool, os.X_OK):
        raise CheckError(f"no promtool at {args.promtool}: install Debian's `prometheus` package or pass --promtool")
    if not FIXTURE_FILTER.exists():
        raise CheckError(f"{FIXTURE_FILTER} is missing (the safety-filter fixture the check's config loads)")

    errors, warnings = [], []
    errors += [f"{Path(args.dashboard).name}: {p}" for p in dashboard_sanity(dashboard)]
    panel_queries = dashboard_queries(dashboard)
    alert_queries = [q for q in yaml_exprs(Path(args.alerts)) if " expr" in q[0]]
    test_queries = yaml_exprs(Path(args.alerts_test))
    if not alert_queries:
        errors.append(f"{args.alerts}: no `expr:` found")

    with tempfile.TemporaryDirectory(prefix="ringmaster-dashboards-") as tmp:
        gateway = Gateway(args.binary, tmp)
        try:
            log(f"starting {args.binary} ...")
            gateway.start()
            log(f"  gateway on {gateway.base}")
        except BaseException:
            gateway.stop()
            raise
        try:
            notes = drive(gateway)
            for note in notes:
                log(f"  {note}")
            exposition = gateway.metrics()
        except (OSError, json.JSONDecodeError) as e:
            raise CheckError(f"talking to the gateway failed: {e}\nits log ends:\n{gateway.log_tail()}") from e
        except CheckError as e:
            raise CheckError(f"{e}\nthe gateway's log ends:\n{gateway.log_tail()}") from e
        finally:
            gateway.stop()
    if args.dump_metrics:
        Path(args.dump_metrics).write_text(exposition)

    series, families = parse_exposition(exposition)
    names = provided_names(series, families)
    dash_names = check_queries("dashboard", panel_queries, series, families, names, errors, warnings)
    alert_names = check_queries("alerts", alert_queries, series, families, names, errors, warnings)
    test_names = check_queries("alert tests", test_queries, series, families, names, errors, warnings)

    log("promtool: the dashboard's queries parse ...")
    check_dashboard_promql(args.promtool, panel_queries, errors)
    log("promtool check rules ...")
    run_promtool(args.promtool, ["check", "rules", os.path.relpath(args.alerts, REPO)], errors)
    log("promtool test rules ...")
    tested = run_promtool(args.promtool, ["test", "rules", os.path.relpath(args.alerts_test, REPO)], errors)

    rules = sum(1 for where, _ in alert_queries)
    panels = sum(1 for p in iter_panels(dashboard.get("panels")) if p.get("type") != "row")
    log("")
    log(f"/metrics: {len(families)} families, {len(series)} series names with samples")
    log(f"dashboard: {panels} panels, {len(panel_queries)} queries, {len(dash_names)} metric names referenced")
    log(f"alerts: {rules} rules, {len(alert_names)} metric names referenced; tests: {len(test_names)} series names")
    if args.verbose:
        for name in sorted(dash_names | alert_names | test_names):
            log(f"  {name}")
    for warning in sorted(set(warnings)):
        log(f"WARN: {warning}")
    if errors:
        for error in errors:
            log(f"FAIL: {error}")
        log(f"\n{len(errors)} problem(s)")
        return 1
    if tested and args.verbose:
        log(tested)
    log(f"OK: all {len(dash_names | alert_names | test_names)} referenced metric names are exported, "
        "labels match, promtool check and test rules pass")
    return 0


if __name__ == "__main__":
    # A terminated check still stops its gateway (the `finally` in main runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        sys.exit(main())
    except CheckError as e:
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
