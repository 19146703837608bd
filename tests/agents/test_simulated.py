"""Claude Code (`claude -p`) and the Codex CLI (`codex exec`) against `ringmaster serve
--simulated`, as the README's tour step 2 sets them up: its blocks run as written (the
gateway's address aside: a free port here, 127.0.0.1:8080 there), each agent completing with
an answer; and each agent's tool loop through the simulated model, which calls the tool the
user's message names and answers in text once the result is back.

tests/run runs this module with tests/agents, inside a network namespace holding only
loopback (RINGMASTER_AGENTS_NETNS=1), with the pinned agents in RINGMASTER_AGENTS_DIR and
the gateway binary in RINGMASTER_BIN. Outside one, the module skips, saying why.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from gateway import binary, free_port, wait_healthy  # noqa: E402
from readme_tour import blocks  # noqa: E402

from capture_proxy import CaptureProxy  # noqa: E402

README_URL = "http://127.0.0.1:8080"
AGENT_TIMEOUT_S = 240
# The shell tools the agents offer, by version: whichever the agent offers is named.
SHELL_TOOLS = ("Bash", "exec_command", "shell_command", "shell")


@pytest.fixture(autouse=True)
def isolated():
    if os.environ.get("RINGMASTER_AGENTS_NETNS") != "1":
        pytest.skip(
            "NOT RUN: the coding-agent tests run only inside a network namespace holding only "
            "loopback (tests/run makes one with `unshare -n` where it can), so that the agents "
            "reach nothing else"
        )


def bin_dir():
    path = os.environ.get("RINGMASTER_AGENTS_DIR")
    bins = os.path.join(path or "", "node_modules", ".bin")
    if not path or not os.path.isdir(bins):
        if os.environ.get("RINGMASTER_REQUIRE_AGENTS") == "1":
            pytest.fail("RINGMASTER_AGENTS_DIR must hold the installed agents (tests/run installs them)")
        pytest.skip("the coding agents are not installed (tests/run installs them into RINGMASTER_AGENTS_DIR)")
    return bins


@contextlib.contextmanager
def simulated_gateway():
    """`ringmaster serve --simulated` on a free port, behind a recording proxy; yields the
    proxy."""
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [binary(), "serve", "--simulated", "--listen", f"127.0.0.1:{port}"],
            stdout=log,
            stderr=log,
            env={k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER_")},
        )
        try:
            if not wait_healthy(proc, f"http://127.0.0.1:{port}"):
                log.seek(0)
                pytest.fail("ringmaster serve --simulated did not start:\n" + log.read())
            proxy = CaptureProxy(port)
            try:
                yield proxy
            finally:
                proxy.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def readme_agent_blocks():
    """Step 2's blocks: (Claude Code's shell, Codex's config, Codex's shell)."""
    agents = [b for b in blocks() if b.tag == "agents"]
    shells = [b for b in agents if b.lang == "sh"]
    configs = [b for b in agents if b.lang == "toml"]
    assert len(shells) == 2 and len(configs) == 1, agents
    claude, codex = shells
    assert "claude " in claude.text and "codex " in codex.text, shells
    return claude.text, configs[0].text, codex.text


def agent_env(home):
    """A bare environment: the agents find nothing of the user's, and send nothing they need
    not (no update checks, no telemetry)."""
    return {
        "PATH": bin_dir() + os.pathsep + os.environ["PATH"],
        "HOME": home,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }


def run(argv, env, cwd):
    """Runs an agent (or the README's block in bash) to its end; its stdout, or a failure."""
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S)
    if result.returncode != 0:
        pytest.fail(f"{argv} exited {result.returncode}:\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result.stdout


def as_readme_says(text, proxy):
    return text.replace(README_URL, proxy.url)


def git_repo(path):
    """`path` as a git repository, as a clone is (Codex works in one)."""
    subprocess.run(["git", "init", "-q", path], check=True)
    return path


def offered_tools(captured):
    names = []
    for request in captured:
        for tool in json.loads(request["body"]).get("tools") or []:
            names.append(tool.get("name") or (tool.get("function") or {}).get("name"))
    return names


def all_answered(captured):
    assert captured, "the agent sent nothing"
    assert all(c["status"] == 200 for c in captured), [(c["path"], c["status"]) for c in captured]


def test_claude_code_answers_through_simulated_servers_as_the_readme_says():
    claude_block, _, _ = readme_agent_blocks()
    with simulated_gateway() as proxy, tempfile.TemporaryDirectory() as home:
        out = run(["bash", "-ec", as_readme_says(claude_block, proxy)], agent_env(home), home)
        assert out.strip(), "an answer"
        sent = proxy.requests("/v1/messages")
        all_answered(sent)
        # Its turn offered its tools, and the simulated servers took them.
        assert "Bash" in offered_tools(sent), offered_tools(sent)


def test_claude_code_runs_the_tool_the_simulated_model_calls():
    claude_block, _, _ = readme_agent_blocks()
    with simulated_gateway() as proxy, tempfile.TemporaryDirectory() as home:
        # The README's set-up, then a prompt that names the shell tool.
        setup = "\n".join(line for line in claude_block.splitlines() if line.startswith("export "))
        script = as_readme_says(setup, proxy) + '\nexec claude -p "Run Bash, then say what it printed." --allowedTools Bash\n'
        out = run(["bash", "-ec", script], agent_env(home), home)
        assert out.strip(), "an answer"
        sent = proxy.requests("/v1/messages")
        all_answered(sent)
        bodies = [json.loads(c["body"]) for c in sent]
        # A later request carried the call the simulated model made and the tool's result.
        blocks_sent = [
            block
            for body in bodies
            for message in body["messages"]
            if isinstance(message.get("content"), list)
            for block in message["content"]
        ]
        calls = [b for b in blocks_sent if b.get("type") == "tool_use" and b.get("name") == "Bash"]
        assert calls and calls[0]["input"] == {"command": ""}, calls
        results = [b for b in blocks_sent if b.get("type") == "tool_result"]
        assert any(r.get("tool_use_id") == calls[0]["id"] for r in results), results


def codex_setup(home, proxy):
    _, config, codex_block = readme_agent_blocks()
    codex_home = os.path.join(home, ".codex")
    os.makedirs(codex_home, exist_ok=True)
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(as_readme_says(config, proxy))
    return as_readme_says(codex_block, proxy)


def test_codex_answers_through_simulated_servers_as_the_readme_says():
    with simulated_gateway() as proxy, tempfile.TemporaryDirectory() as home:
        script = codex_setup(home, proxy)
        out = run(["bash", "-ec", script], agent_env(home), git_repo(os.path.join(home, "clone")))
        assert out.strip(), "an answer"
        sent = proxy.requests("/v1/responses")
        all_answered(sent)
        assert any(name in SHELL_TOOLS for name in offered_tools(sent)), offered_tools(sent)


def test_codex_runs_the_tool_the_simulated_model_calls():
    with simulated_gateway() as proxy, tempfile.TemporaryDirectory() as home:
        script = codex_setup(home, proxy)
        cwd = git_repo(os.path.join(home, "clone"))
        # Which shell tool this Codex offers: asked once, as the README asks.
        run(["bash", "-ec", script], agent_env(home), cwd)
        tool = next(n for n in offered_tools(proxy.requests("/v1/responses")) if n in SHELL_TOOLS)
        setup = "\n".join(line for line in script.splitlines() if line.startswith("export "))
        script = setup + (
            f'\nexec codex exec --sandbox danger-full-access "Run {tool}, then say what it printed."\n'
        )
        out = run(["bash", "-ec", script], agent_env(home), cwd)
        assert out.strip(), "an answer"
        sent = proxy.requests("/v1/responses")
        all_answered(sent)
        items = [i for c in sent for i in (json.loads(c["body"]).get("input") or []) if isinstance(i, dict)]
        calls = [i for i in items if i.get("type") == "function_call" and i.get("name") == tool]
        assert calls, [i.get("type") for i in items]
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        assert any(o.get("call_id") == calls[0]["call_id"] for o in outputs), outputs
