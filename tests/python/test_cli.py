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
