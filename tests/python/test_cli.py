"""The `ringmaster` binary as an operator meets it: its help, `check-config`, and the log it
writes to a file."""

import os
import subprocess
import tempfile
import time
import urllib.request

from gateway import SIMULATED_FLEET, binary, free_port


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
                deadline = time.time() + 30
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                            break
                    except OSError:
                        assert proc.poll() is None and time.time() < deadline, open(log_path).read()
                        time.sleep(0.05)
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
                deadline = time.time() + 30
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                            break
                    except OSError:
                        assert proc.poll() is None and time.time() < deadline, open(log_path).read()
                        time.sleep(0.05)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        text = open(log_path).read()
        assert "no model in the model cache" in text and "cargo xtask model" in text, text
