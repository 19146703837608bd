"""The coding agents people run, through Ringmaster: Claude Code (`claude -p`) and the Codex CLI
(`codex exec`), headless, each completing a tool loop in front of a scripted server (it asks
for one shell call that computes a number no prompt holds, then answers with what the call
printed, so the number reaches the agent's answer only if the command ran); a Claude Code
turn through a llama-cpp-python server on SmolLM2; a multi-turn Claude Code conversation,
its billing line new on every request as the interactive build sends it, whose later turns
find their whole system prompt and tools cached on the server they reach, and the same
conversation through a gateway without the hygiene (`volatile_prefix = []`), whose later
turns do not (the check can fail); and every request the agents sent in these runs, replayed
with random unknown fields added, still served.

tests/run installs the pinned agents (tests/agents/package.json) once into a cache and runs
this module inside a network namespace that holds only loopback (`unshare -n`), so the agents
reach nothing but the gateway and its servers; it sets RINGMASTER_AGENTS_DIR (their
node_modules) and RINGMASTER_AGENTS_NETNS=1. Outside one, the module skips, saying why.
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

from gateway import free_port, running  # noqa: E402

from capture_proxy import CaptureProxy, FreshBillingLine  # noqa: E402
from scripted_server import BLOCK, CHARS_PER_TOKEN, SHELL_TOOLS, text_of  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "scripted"
API_KEY = "sk-ringmaster-agent-test"
AGENT_TIMEOUT_S = 180

# Every agent request the proxies captured in this module's runs: what the replay replays.
CAPTURED = []


def agents_dir():
    path = os.environ.get("RINGMASTER_AGENTS_DIR")
    if not path or not os.path.isdir(os.path.join(path, "node_modules", ".bin")):
        if os.environ.get("RINGMASTER_REQUIRE_AGENTS") == "1":
            pytest.fail("RINGMASTER_AGENTS_DIR must hold the installed agents (tests/run installs them)")
        pytest.skip("the coding agents are not installed (tests/run installs them into RINGMASTER_AGENTS_DIR)")
    return os.path.join(path, "node_modules", ".bin")


@pytest.fixture(autouse=True)
def isolated():
    if os.environ.get("RINGMASTER_AGENTS_NETNS") != "1":
        pytest.skip(
            "NOT RUN: the coding-agent tests run only inside a network namespace holding only "
            "loopback (tests/run makes one with `unshare -n` where it can), so that the agents "
            "reach nothing else"
        )


class Scripted:
    """One scripted OpenAI-compatible server on a free loopback port. Its shell call prints the
    product of two numbers drawn here (`product`): digits that no prompt holds."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        a, b = random.randrange(100_003, 999_983), random.randrange(100_003, 999_983)
        self.command = f"echo $(({a} * {b}))"
        self.product = str(a * b)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "scripted_server.py"), str(self.port), str(a), str(b)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    pytest.fail("the scripted server did not start")
                time.sleep(0.05)

    def requests(self):
        """What it was asked, in order: each request's body, rendered prompt, head (the
        length of its system prompt and tools) and cached tokens."""
        with urllib.request.urlopen(self.url + "/requests", timeout=5) as r:
            return json.load(r)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def gateway_config(servers, model=MODEL):
    lines = [f'models = ["{model}"]']
    for server in servers:
        lines += ["[[servers]]", f'address = "{server}"', f'models = ["{model}"]']
    return "\n".join(lines) + "\n"


def run_agent(argv, env, cwd):
    """Runs an agent headless; its stdout, or a failure with what it printed."""
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S)
    if result.returncode != 0:
        pytest.fail(f"{argv[0]} exited {result.returncode}:\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result.stdout


def claude_env(home, base_url, model=MODEL):
    return {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }


def claude(bin_dir, home, cwd, base_url, prompt, *extra):
    argv = [os.path.join(bin_dir, "claude"), "-p", prompt, "--allowedTools", "Bash", *extra]
    return run_agent(argv, claude_env(home, base_url), cwd)


def codex(bin_dir, home, cwd, base_url, prompt):
    codex_home = os.path.join(home, ".codex")
    os.makedirs(codex_home, exist_ok=True)
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(
            f'model = "{MODEL}"\nmodel_provider = "ringmaster"\n'
            "[model_providers.ringmaster]\n"
            'name = "Ringmaster"\n'
            f'base_url = "{base_url}/v1"\n'
            'env_key = "RINGMASTER_API_KEY"\n'
            'wire_api = "responses"\n'
        )
    env = {"PATH": os.environ["PATH"], "HOME": home, "CODEX_HOME": codex_home, "RINGMASTER_API_KEY": API_KEY}
    argv = [os.path.join(bin_dir, "codex"), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", prompt]
    return run_agent(argv, env, cwd)


def metric(url, name, **labels):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


PROMPT = "Multiply the two numbers with the shell and tell me what it printed."


def tool_results(request):
    """The tool results a request the scripted server got carries."""
    return [text_of(m.get("content")) for m in request["body"]["messages"] if m.get("role") == "tool"]


def assert_the_command_ran(server, out):
    """The shell call's computed output, which no prompt held before the tool ran, reached
    the server as the tool's result and the agent's answer: echoing the prompt cannot pass."""
    got = server.requests()
    product = server.product
    assert product not in PROMPT and product not in server.command, (product, server.command)
    asked = [r for r in got if not tool_results(r)]
    assert asked and all(product not in r["prompt"] for r in asked), product
    # Nor did the call the agent made, as the server got it back, hold it.
    calls = [(c.get("function") or {}).get("arguments") or "" for r in got
             for m in r["body"]["messages"] for c in m.get("tool_calls") or []]
    assert calls and all(product not in c for c in calls), (product, calls)
    results = [text for r in got for text in tool_results(r)]
    assert any(product in text for text in results), (product, results)
    assert product in out, (product, out)
    return got


def test_claude_code_runs_a_tool_through_the_gateway():
    bin_dir = agents_dir()
    server = Scripted()
    try:
        with running(gateway_config([server.url])) as url, tempfile.TemporaryDirectory() as home:
            proxy = CaptureProxy(int(url.rsplit(":", 1)[1]))
            out = claude(bin_dir, home, home, proxy.url, PROMPT)
            assert f"The tool printed: {server.product}" in out, out
            sent = proxy.requests("/v1/messages")
            CAPTURED.extend(sent)
            proxy.close()
            assert all(c["status"] == 200 for c in sent), [(c["path"], c["status"]) for c in sent]
            # Claude Code's own fields reached the gateway, and their fate is named.
            first = json.loads(sent[0]["body"])
            assert "context_management" in first and "thinking" in first, sorted(first)
            assert "context_management" in (sent[0]["dropped"] or ""), sent[0]["dropped"]
            got = assert_the_command_ran(server, out)
            assert len(got) >= 2, got
            for request in got:
                body = request["body"]
                # Strict in what it sends: nothing the client did not ask for or the API lacks.
                assert "ringmaster_priority" not in body and "tool_choice" not in body, sorted(body)
                assert "x-anthropic-billing-header" not in json.dumps(body)
            assert metric(url, "ringmaster_dropped_fields_total", door="messages", field="context_management") >= 2
    finally:
        server.stop()


def test_codex_runs_a_tool_through_the_responses_door():
    bin_dir = agents_dir()
    server = Scripted()
    try:
        with running(gateway_config([server.url])) as url, tempfile.TemporaryDirectory() as home:
            proxy = CaptureProxy(int(url.rsplit(":", 1)[1]))
            out = codex(bin_dir, home, home, proxy.url, PROMPT)
            assert "The tool printed" in out, out
            sent = proxy.requests("/v1/responses")
            CAPTURED.extend(sent)
            proxy.close()
            assert len(sent) >= 2 and all(c["status"] == 200 for c in sent), [(c["path"], c["status"]) for c in sent]
            first = json.loads(sent[0]["body"])
            assert first["store"] is False and first["prompt_cache_key"], sorted(first)
            assert_the_command_ran(server, out)
            # The session is the prompt cache key: every turn of the run reached one server.
            assert len({c["server"] for c in sent}) == 1
            assert metric(url, "ringmaster_dropped_fields_total", door="responses", field="tools.web_search") >= 1
    finally:
        server.stop()


def claude_conversation(bin_dir, routing=""):
    """Three `claude -p` runs of one conversation (the first with a tool call) through a
    gateway in front of two scripted servers, configured with `routing` besides, each request's
    billing line given a `cch=` of its own on the way (the interactive build's). Returns the
    Messages requests sent, the conversation's own requests as the servers got them in the
    order they came (those that offer the shell tool: an agent's side requests are left
    out), the billing lines written, and the gateway's cached-tokens metric."""
    servers = [Scripted(), Scripted()]
    fresh = FreshBillingLine()
    try:
        with running(gateway_config([s.url for s in servers]) + routing) as url, \
                tempfile.TemporaryDirectory() as home:
            proxy = CaptureProxy(int(url.rsplit(":", 1)[1]), rewrite=fresh)
            cwd = os.path.join(home, "project")
            os.makedirs(cwd)
            claude(bin_dir, home, cwd, proxy.url, PROMPT)
            for turn in ("Now say it once more.", "And once more, briefly."):
                claude(bin_dir, home, cwd, proxy.url, turn, "--continue")
            sent = proxy.requests("/v1/messages")
            CAPTURED.extend(sent)
            proxy.close()
            cached_metric = metric(url, "ringmaster_prefix_cached_tokens_total", door="messages")
        answered = sorted((r for s in servers for r in s.requests()), key=lambda r: r["at"])
    finally:
        for server in servers:
            server.stop()
    turns = [r for r in answered if any((t.get("function") or {}).get("name") in SHELL_TOOLS
                                        for t in r["body"].get("tools") or [])]
    # Every Messages request carried a billing line, each one new: none can be found cached.
    assert len(fresh.lines) == len(sent) and len(set(fresh.lines)) == len(sent), (len(fresh.lines), len(sent))
    assert len(turns) >= 4, [(c["status"], c["server"]) for c in sent]
    return sent, turns, fresh.lines, cached_metric


def head_blocks(request):
    """The cached tokens that cover a request's system prompt and tools: the head's whole
    blocks, as the scripted server counts what it finds cached."""
    return request["head"] // BLOCK * BLOCK // CHARS_PER_TOKEN


def test_a_claude_code_conversation_finds_its_system_prompt_and_tools_cached_on_the_server_it_reaches():
    sent, turns, _, cached_metric = claude_conversation(agents_dir())
    assert all(c["status"] == 200 for c in sent), [(c["status"], c["dropped"]) for c in sent]
    assert len({c["server"] for c in sent}) == 1, [c["server"] for c in sent]
    # The gateway took the line out: no server saw one, and every turn's head (system prompt
    # and tools) is the first turn's, byte for byte.
    assert not any("x-anthropic-billing-header" in r["prompt"] for r in turns)
    first = turns[0]
    assert head_blocks(first) >= 100, first["head"]
    for request in turns[1:]:
        assert request["prompt"][: request["head"]] == first["prompt"][: first["head"]]
        # Every later turn found at least its whole system prompt and tools already held.
        assert request["cached_tokens"] >= head_blocks(request), (request["cached_tokens"], head_blocks(request))
    assert cached_metric >= sum(head_blocks(r) for r in turns[1:]), cached_metric


def test_without_the_hygiene_the_same_conversation_misses_its_system_prompt():
    # The check above, on a gateway that keeps the billing line (`volatile_prefix = []`):
    # the line, new on every request, leads every prompt, so no later turn finds more than
    # the blocks before its `cch=` cached. Were this to pass the check above, the check could
    # not tell the hygiene from its absence.
    sent, turns, lines, _ = claude_conversation(agents_dir(), "[routing]\nvolatile_prefix = []\n")
    assert all(c["status"] == 200 for c in sent), [(c["status"], c["dropped"]) for c in sent]
    # The session (metadata.user_id) still holds every turn to one server: what the turns
    # miss below is that server's cache, not another server's.
    assert len({c["server"] for c in sent}) == 1, [c["server"] for c in sent]
    # The servers saw the line, a different one on every turn.
    seen = [[line for line in lines if line in r["prompt"]] for r in turns]
    assert all(len(found) == 1 for found in seen), seen
    assert len({found[0] for found in seen}) == len(turns), seen
    for request in turns[1:]:
        assert request["cached_tokens"] < head_blocks(request), (request["cached_tokens"], head_blocks(request))


def test_a_claude_code_turn_through_llama_cpp_python():
    bin_dir = agents_dir()
    from test_llama_cpp_server import MODEL as LLAMA_MODEL
    from test_llama_cpp_server import LlamaServer

    server = LlamaServer()
    try:
        server.wait_ready()
        with running(gateway_config([server.url], model=LLAMA_MODEL)) as url, tempfile.TemporaryDirectory() as home:
            proxy = CaptureProxy(int(url.rsplit(":", 1)[1]))
            # The bare mode's short prompt fits SmolLM2's 2,048-token window.
            out = run_agent(
                [os.path.join(bin_dir, "claude"), "-p", "What is the capital of France? One word.",
                 "--bare", "--tools", "", "--system-prompt", "Answer in one short sentence."],
                claude_env(home, proxy.url, LLAMA_MODEL),
                home,
            )
            sent = proxy.requests("/v1/messages")
            CAPTURED.extend(sent)
            proxy.close()
            assert out.strip(), "an answer"
            assert all(c["status"] == 200 for c in sent), [(c["status"], c["dropped"]) for c in sent]
    finally:
        server.kill()


def unknown_field():
    return st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12).map(lambda s: "x_" + s)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)


def add_fields(body, rng, additions):
    """`body` with `additions` (name, value) put into random objects of it."""
    objects = []

    def walk(value):
        if isinstance(value, dict):
            objects.append(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(body)
    for name, value in additions:
        rng.choice(objects)[name] = value
    return body


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32 - 1),
    additions=st.lists(st.tuples(unknown_field(), JSON_VALUES), min_size=1, max_size=4),
)
def test_every_agent_request_with_unknown_fields_added_is_still_served(seed, additions):
    if not CAPTURED:
        pytest.skip("no agent requests were captured in this run")
    rng = random.Random(seed)
    request = rng.choice(CAPTURED)
    body = add_fields(json.loads(request["body"]), rng, additions)
    body["model"] = MODEL
    # Replayed whole, not streamed: one answer to check.
    body["stream"] = False
    path = request["path"]
    headers = {k: v for k, v in request["headers"].items() if k.lower() != "content-length"}
    data = json.dumps(body).encode()
    req = urllib.request.Request(REPLAY.url + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
    except urllib.error.HTTPError as e:
        pytest.fail(f"{path} with {additions} answered {e.code}: {e.read()[:500]}")


class Replay:
    """A gateway in front of a scripted server, for the replay (started once, with the module)."""

    url = None


REPLAY = Replay()


@pytest.fixture(scope="module", autouse=True)
def replay_gateway():
    if os.environ.get("RINGMASTER_AGENTS_NETNS") != "1":
        yield
        return
    server = Scripted()
    try:
        with running(gateway_config([server.url])) as url:
            REPLAY.url = url
            yield
    finally:
        server.stop()
