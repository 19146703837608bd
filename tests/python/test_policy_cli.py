"""A policy author's path with `ringmaster policy`, as the README tells it: scaffold a Python
router outside the repository, unit-test it, build it, replay a trace through it next to the
default, push it into a running gateway as a 10 % variant, and read the A/B comparison.

The binary comes from RINGMASTER_BIN; componentize-py from the kit's cached virtualenv (made
on first use, as `tests/run` already did when it built examples/python-router).
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import anthropic

from gateway import SIMULATED_FLEET, binary, running

ADMIN_TOKEN = "policy-cli-test-token-0123456789"
API_KEY = "sk-ringmaster-policy-cli"
MODEL = "sim-llama-3-8b"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE = os.path.join(ROOT, "host/replay/fixtures/mooncake_conversation_head.jsonl")


def run(args, cwd, **kwargs):
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def admin(url, path):
    request = urllib.request.Request(url + path, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_scaffold_test_build_replay_push_and_compare():
    ringmaster = binary()
    with tempfile.TemporaryDirectory() as tmp:
        out = run([ringmaster, "policy", "new", "my-router", "--lang", "python"], cwd=tmp)
        assert "wrote a python router" in out
        project = os.path.join(tmp, "my-router")
        run([sys.executable, "-m", "unittest", "discover", "-s", "tests"], cwd=project)

        out = run([ringmaster, "policy", "build"], cwd=project)
        component = os.path.join(project, "my-router.wasm")
        assert os.path.getsize(component) > 1_000_000, out

        out = run([ringmaster, "policy", "check", component], cwd=project)
        assert "is a router component (ringmaster:policy@0.3.0)" in out and "per call" in out, out

        out = run([ringmaster, "policy", "test", component, "--trace", TRACE,
                   "--requests", "120", "--out", os.path.join(tmp, "replay")], cwd=project)
        rows = [line for line in out.splitlines() if line.startswith("| ")]
        assert any(component in row for row in rows), out
        assert any("builtin:prefix-affinity" in row for row in rows), out
        assert any("shared LRU" in row for row in rows), out

        config = f"""
models = ["{MODEL}"]
admin_token = "{ADMIN_TOKEN}"
[[api_keys]]
key = "{API_KEY}"
""" + SIMULATED_FLEET
        with running(config) as url:
            # The default variant keeps weight 100: the new one gets 10 / 110 of traffic.
            env = dict(os.environ, RINGMASTER_ADMIN_TOKEN=ADMIN_TOKEN)
            out = run([ringmaster, "policy", "push", component, "--gateway", url,
                       "--variant", "my-router", "--weight", "10"], cwd=project, env=env)
            assert out.startswith("my-router: now runs version "), out

            client = anthropic.Anthropic(base_url=url, api_key=API_KEY, max_retries=0)
            variants = set()
            for i in range(60):
                response = client.messages.with_raw_response.create(
                    model=MODEL, max_tokens=4,
                    messages=[{"role": "user", "content": f"conversation {i}: hello"}],
                )
                variants.add(response.headers["x-ringmaster-variant"])
                assert response.parse().content[0].type == "text"
            assert variants == {"default", "my-router"}, variants

            experiments = admin(url, "/admin/experiments")
            names = {v["name"] for v in experiments["variants"]}
            assert {"default", "my-router"} <= names, experiments
            mine = next(v for v in experiments["variants"] if v["name"] == "my-router")
            assert mine["requests"] > 0, experiments


def test_a_scaffolded_c_router_tests_natively_builds_and_checks():
    """`new --lang c` gives a project that builds as it is: its unit tests with the system's cc
    (make test), its component with zig cc (cached by tests/run's build of examples/c-router)."""
    ringmaster = binary()
    with tempfile.TemporaryDirectory() as tmp:
        out = run([ringmaster, "policy", "new", "edge-router", "--lang", "c"], cwd=tmp)
        assert "wrote a c router" in out
        project = os.path.join(tmp, "edge-router")
        out = run(["make", "test"], cwd=project)
        assert "edge-router: all tests passed" in out, out
        run([ringmaster, "policy", "build"], cwd=project)
        component = os.path.join(project, "edge-router.wasm")
        assert 1_000 < os.path.getsize(component) < 200_000
        out = run([ringmaster, "policy", "check", component], cwd=project)
        assert "is a router component (ringmaster:policy@0.3.0)" in out and "per call" in out, out


def test_scaffolded_rust_policies_test_natively_build_and_check():
    """`new --lang rust` gives a project that builds as it is, in each world: `cargo test`
    natively, then the component with the Wasm toolchain `tests/run` already set up for the
    built-in policies (rustup's target, else Debian's rustc-web with std built from source,
    under a minute each)."""
    ringmaster = binary()
    with tempfile.TemporaryDirectory() as tmp:
        # One target folder for the three Wasm builds (tests/run's own when it sets one):
        # the standard library is built for Wasm once, not once per project.
        wasm_env = {**os.environ,
                    "CARGO_TARGET_DIR": os.environ.get("CARGO_TARGET_DIR") or os.path.join(tmp, "wasm")}
        for world in ["router", "admission", "safety-filter"]:
            name = f"edge-{world}"
            out = run([ringmaster, "policy", "new", name, "--lang", "rust", "--world", world],
                      cwd=tmp)
            assert f"wrote a rust {world}" in out, out
            project = os.path.join(tmp, name)
            out = run(["cargo", "test", "--quiet"], cwd=project,
                      env={**os.environ, "CARGO_TARGET_DIR": os.path.join(tmp, "native")})
            run([ringmaster, "policy", "build"], cwd=project, env=wasm_env)
            component = os.path.join(project, f"{name}.wasm")
            assert 1_000 < os.path.getsize(component) < 500_000
            out = run([ringmaster, "policy", "check", component], cwd=project)
            # Rust scaffolds target the current contract.
            assert (f"is a {world} component (ringmaster:policy@0.3.0)" in out
                    or f"is an {world} component (ringmaster:policy@0.3.0)" in out), out


def test_a_pair_router_is_replayed_on_a_disaggregated_layout():
    """`policy test --layout 1P3D` replays a pair router (and the default router beside it)
    on one prefill and three decode servers next to the aggregated fleet: the table says how
    many requests each split."""
    ringmaster = binary()
    component = os.path.join(ROOT, "policies/dist/pair-split.wasm")
    with tempfile.TemporaryDirectory() as tmp:
        out = run([ringmaster, "policy", "test", component, "--trace", TRACE, "--requests", "120",
                   "--servers", "4", "--layout", "1P3D", "--against", "builtin:prefix-affinity",
                   "--out", tmp], cwd=tmp)
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    split = {row[1].strip(): int(row[3]) for row in rows if row[3].strip().isdigit()}
    pair = [label for label in split if label.startswith(component) and "1P3D" in label]
    assert pair and split[pair[0]] == 120, out
    aggregated = [label for label in split if label.endswith("· aggregated")]
    assert aggregated and all(split[label] == 0 for label in aggregated), out
