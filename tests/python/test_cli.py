"""The `ringmaster` binary as an operator meets it: its help, `check-config`, and the log it
writes to a file."""

import json
import os
import subprocess
import tempfile
import urllib.request

from gateway import SIMULATED_FLEET, binary, free_port, redis, running, wait_healthy


def run(*args, **kwargs):
    return subprocess.run([binary(), *args], capture_output=True, text=True, timeout=60, **kwargs)


def test_help_names_the_router_policy_and_every_policy_language():
    serve = run("serve", "--help").stdout
    assert "--router" in serve and "builtin:NAME" in serve
    assert "strategy" not in serve.lower(), serve
    policy = run("--help").stdout
    assert "Rust, Python, JavaScript or C" in policy, policy


def test_check_config_names_the_router_and_what_is_deprecated():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "old.toml")
        with open(path, "w") as f:
            f.write('[routing]\nstrategy = "round-robin"\n')
        out = run("check-config", path)
        assert out.returncode == 0, out.stderr
        assert "router     default = builtin:round-robin" in out.stdout, out.stdout
        assert "deprecated" in out.stdout and "routing.router" in out.stdout, out.stdout
        plain = run("check-config", os.devnull)
        assert "router     default = builtin:prefix-affinity" in plain.stdout, plain.stdout


def test_check_config_into_a_pipe_closed_early_is_no_panic():
    # `ringmaster check-config … | head -1`: the reader is gone before the report is written.
    proc = subprocess.Popen(
        [binary(), "check-config", os.devnull], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "panicked" not in err, err


DIST = os.path.join(os.path.dirname(__file__), "..", "..", "policies", "dist")


def test_check_config_loads_each_component_and_names_the_models_served():
    """A router file that is missing, or a component of another world, fails `check-config`
    (it would stop `serve`); a good one is named with its world and contract; the models line
    says which servers are asked for theirs instead of printing the simulated default."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gw.toml")

        def check(body):
            with open(path, "w") as f:
                f.write(body)
            return run("check-config", path)

        missing = check('[[policies.router]]\nname = "mine"\nsource = "/nonexistent/router.wasm"\n')
        assert missing.returncode != 0, missing.stdout
        assert "the router policy /nonexistent/router.wasm cannot be loaded" in missing.stderr, missing.stderr

        safety = os.path.abspath(os.path.join(DIST, "blocklist.wasm"))
        wrong = check(f'[[policies.router]]\nname = "mine"\nsource = "{safety}"\n')
        assert wrong.returncode != 0, wrong.stdout
        assert "is a safety-filter component, not router or learning-router" in wrong.stderr, wrong.stderr

        router = os.path.abspath(os.path.join(DIST, "round-robin.wasm"))
        good = check(f'[[policies.router]]\nname = "mine"\nsource = "{router}"\n'
                     '[[servers]]\naddress = "http://10.0.0.7:8000"\n'
                     '[[servers]]\naddress = "http://10.0.0.8:8000"\nmodels = ["qwen3-8b"]\n')
        assert good.returncode == 0, good.stderr
        assert f"router     mine = {router} (router component, ringmaster:policy@" in good.stdout, good.stdout
        assert "models     qwen3-8b, what 1 server(s) list at /v1/models" in good.stdout, good.stdout
        assert "sim-llama-3-8b" not in good.stdout, good.stdout


def test_a_log_written_to_a_file_has_no_colour_codes():
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "ringmaster.toml")
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\naccess_log = true\n{SIMULATED_FLEET}')
        log_path = os.path.join(tmp, "gateway.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([binary(), "serve", "--config", config], stdout=log, stderr=log)
            try:
                assert wait_healthy(proc, f"http://127.0.0.1:{port}"), open(log_path).read()
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        text = open(log_path, "rb").read()
        assert b"gateway.listening" in text, text
        assert b"request.done" in text, text
        assert b"\x1b[" not in text, text


def test_the_first_command_says_it_found_no_model_in_its_log():
    """`ringmaster serve` with no config and an empty model cache serves simulated servers and
    says so in its log (the line was once written before logging was set up, so never)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, RINGMASTER_MODEL_DIR=tmp, RUST_LOG="info")
        log_path = os.path.join(tmp, "gateway.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([binary(), "serve", "--listen", f"127.0.0.1:{port}"],
                                    stdout=log, stderr=log, env=env)
            try:
                assert wait_healthy(proc, f"http://127.0.0.1:{port}"), open(log_path).read()
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        text = open(log_path).read()
        assert "no model in the model cache" in text and "cargo xtask model" in text, text


def serve_outcome(config_text, env=None, timeout=30):
    """Starts `ringmaster serve` on `config_text` (a free loopback port is added) and says
    whether it served: (True, log) once /healthz answers, (False, log) when it exits first."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "ringmaster.toml")
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\n{config_text}')
        log_path = os.path.join(tmp, "gateway.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([binary(), "serve", "--config", config], stdout=log, stderr=log,
                                    env=dict(os.environ, RUST_LOG="info", **(env or {})))
            try:
                served = wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=timeout)
                assert served or proc.poll() is not None, open(log_path).read()
                return served, open(log_path).read()
            finally:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait(timeout=30)


def test_check_config_refuses_what_serve_refuses_and_passes_what_it_serves():
    """One validation: `check-config` once passed `router = "builtin:tiered"` (an admission
    policy), which `serve` refused."""
    cases = {
        'routing.router': '[routing]\nrouter = "builtin:tiered"\n',
        'policies.router[0].source': '[[policies.router]]\nname = "a"\nsource = "builtin:blocklist"\n',
        'policies.admission.source': '[policies.admission]\nsource = "builtin:round-robin"\n',
        None: '[routing]\nrouter = "builtin:least-loaded"\n'
              '[policies.admission]\nsource = "builtin:tiered"\n'
              '[policies.safety]\nsource = "builtin:blocklist"\n',
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gw.toml")
        for key, body in cases.items():
            body = body + SIMULATED_FLEET
            with open(path, "w") as f:
                f.write(body)
            checked = run("check-config", path)
            served, log = serve_outcome(body)
            assert (checked.returncode == 0) == served, (body, checked.stderr, log)
            if key is None:
                assert served, log
            else:
                assert not served and key in checked.stderr and key in log, (checked.stderr, log)


def test_start_up_lines_read_as_words_not_rust():
    """The start-up log says `admin=off`, `admin=on this port` or the admin listener's
    address, and never `None` or `Some(…)`."""
    token = "an-admin-token-long-enough"
    admin_port = free_port()
    for extra, expected in [
        ("", "admin=off"),
        (f'admin_token = "{token}"\n', "admin=on this port"),
        (f'admin_token = "{token}"\n[admin]\nlisten = "127.0.0.1:{admin_port}"\n',
         f"admin=127.0.0.1:{admin_port}"),
    ]:
        served, log = serve_outcome(extra + SIMULATED_FLEET)
        assert served, log
        listening = [line for line in log.splitlines() if "gateway.listening" in line]
        assert len(listening) == 1, log
        assert expected in listening[0] and "tls=off" in listening[0], listening[0]
        assert "router=builtin:prefix-affinity" in listening[0], listening[0]
        assert "None" not in log and "Some(" not in log, log


def test_a_toml_error_shows_its_snippet_once():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bad.toml")
        with open(path, "w") as f:
            f.write('listen = "127.0.0.1:8080"\nunknown_setting = 3\n')
        for command in (["check-config", path], ["serve", "--config", path]):
            out = run(*command)
            assert out.returncode != 0, out.stdout
            assert out.stderr.count("unknown_setting = 3") == 1, out.stderr
            assert "unknown field" in out.stderr, out.stderr


def test_a_short_admin_token_from_the_environment_names_the_variable():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gw.toml")
        with open(path, "w") as f:
            f.write(SIMULATED_FLEET)
        out = run("check-config", path, env=dict(os.environ, RINGMASTER_ADMIN_TOKEN="short"))
        assert out.returncode != 0, out.stdout
        assert "RINGMASTER_ADMIN_TOKEN" in out.stderr and "admin_token" not in out.stderr, out.stderr


class FakeAdmin:
    """An admin API that answers `policy push` as a cluster's replica does: the component is
    revision 7, `?wait=true` answers `applied_everywhere: false` (a replica was slow), and
    `/admin/cluster` shows replica b behind until `catch_up_after` reads of it."""

    def __init__(self, catch_up_after):
        import http.server
        import threading

        fake = self
        self.catch_up_after = catch_up_after
        self.cluster_reads = 0
        self.put_paths = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, value):
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path.startswith("/admin/cluster"):
                    fake.cluster_reads += 1
                    b = 7 if fake.cluster_reads > fake.catch_up_after else 6
                    self.answer({"replicas": [{"replica": "a", "applied_revision": 7},
                                              {"replica": "b", "applied_revision": b}]})
                else:
                    self.answer({"router": {"variants": []}})

            def do_PUT(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                fake.put_paths.append(self.path)
                wait = "wait=true" in self.path
                self.answer({"changed": True, "revision": 7,
                             **({"applied_everywhere": False} if wait else {}),
                             "router": {"variants": [{"name": "default", "hash": "abc123"}]}})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


def test_policy_push_wait_returns_once_every_replica_applied_it():
    component = os.path.abspath(os.path.join(DIST, "round-robin.wasm"))
    env = dict(os.environ, RINGMASTER_ADMIN_TOKEN="a-token-of-sixteen-or-more")
    fake = FakeAdmin(catch_up_after=3)
    try:
        out = run("policy", "push", component, "--gateway", fake.url, "--wait", env=env)
        assert out.returncode == 0, out.stderr
        assert "wait=true" in fake.put_paths[-1], fake.put_paths
        # It read the replicas until b had caught up, not once.
        assert fake.cluster_reads == 4, fake.cluster_reads
        assert "revision 7, applied by every live replica: a, b" in out.stdout, out.stdout
        # Without --wait it neither asks the gateway to wait nor reads the replicas.
        reads = fake.cluster_reads
        out = run("policy", "push", component, "--gateway", fake.url, env=env)
        assert out.returncode == 0, out.stderr
        assert "wait=true" not in fake.put_paths[-1] and fake.cluster_reads == reads
    finally:
        fake.close()
    fake = FakeAdmin(catch_up_after=10**9)
    try:
        out = run("policy", "push", component, "--gateway", fake.url, "--wait",
                  "--wait-timeout", "1", env=env)
        assert out.returncode != 0, out.stdout
        assert "b (at 6)" in out.stderr and "revision 7" in out.stderr, out.stderr
    finally:
        fake.close()


def test_policy_push_wait_on_a_real_fleet_names_every_replica_and_each_runs_it():
    """The same against two replicas sharing a Redis: the answer's revision and the replicas
    `--wait` names are the real admin API's, and when it returns both replicas run the new
    version."""
    token = "fleet-push-wait-token-0123"
    config = f'admin_token = "{token}"\n{SIMULATED_FLEET}'
    component = os.path.abspath(os.path.join(DIST, "round-robin.wasm"))
    env = dict(os.environ, RINGMASTER_ADMIN_TOKEN=token)

    def variants(url):
        request = urllib.request.Request(url + "/admin/policies",
                                         headers={"authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return {v["name"]: v["hash"] for v in json.load(response)["router"]["variants"]}

    with redis() as cluster, \
            running(config, args=("--cluster", cluster, "--replica", "a")) as a, \
            running(config, args=("--cluster", cluster, "--replica", "b")) as b:
        out = run("policy", "push", component, "--gateway", a, "--variant", "rr", "--weight", "1",
                  "--wait", env=env)
        assert out.returncode == 0, out.stderr
        assert "applied by every live replica: a, b" in out.stdout, out.stdout
        pushed = out.stdout.split("version ")[1].split()[0]
        assert variants(a).get("rr") == pushed and variants(b).get("rr") == pushed, out.stdout
