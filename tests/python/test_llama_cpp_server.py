"""A real server behind the gateway: two llama-cpp-python OpenAI-compatible servers
(`python -m llama_cpp.server`) on SmolLM2-135M, the official Anthropic and OpenAI SDKs through
Ringmaster, plain and streamed, and one server killed mid-run.

tests/run builds llama-cpp-python from source once (its own virtualenv, cached) and sets
RINGMASTER_LLAMA_PYTHON (that virtualenv's python) and RINGMASTER_SMOLLM (the model file).
"""

import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.request

import anthropic
import openai
import pytest

from gateway import free_port, running

MODEL = "smollm"
ADMIN_TOKEN = "llama-admin-token-for-tests"


def required(name):
    value = os.environ.get(name)
    if not value or not os.path.exists(value):
        pytest.fail(f"{name} must name an existing file (tests/run sets it)")
    return value


class LlamaServer:
    """One `python -m llama_cpp.server` on a free loopback port."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.proc = subprocess.Popen(
            [
                required("RINGMASTER_LLAMA_PYTHON"),
                "-m",
                "llama_cpp.server",
                "--model",
                required("RINGMASTER_SMOLLM"),
                "--model_alias",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--n_ctx",
                "2048",
                "--n_threads",
                "1",
            ],
            stdout=self.log,
            stderr=self.log,
        )

    def wait_ready(self):
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                pytest.fail("llama_cpp.server did not start:\n" + self.log.read()[-4000:])
            time.sleep(0.2)

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def fleet():
    servers = [LlamaServer(), LlamaServer()]
    try:
        for server in servers:
            server.wait_ready()
        config = f'models = ["{MODEL}"]\nadmin_token = "{ADMIN_TOKEN}"\n' + "".join(
            f'[[servers]]\nid = "llama-{i}"\naddress = "{s.url}"\n'
            for i, s in enumerate(servers)
        )
        with running(config) as url:
            yield url, servers
    finally:
        for server in servers:
            server.stop()


def anthropic_client(url):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def openai_client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask_anthropic(url, text="Name a colour."):
    return anthropic_client(url).messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": text}]
    )


def test_the_anthropic_sdk_plain_and_streamed(fleet):
    url, _ = fleet
    message = ask_anthropic(url)
    assert message.model == MODEL
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0

    with anthropic_client(url).messages.stream(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Count to three."}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("max_tokens", "end_turn")
    assert final.usage.output_tokens > 0


def test_the_openai_sdk_plain_and_streamed(fleet):
    url, _ = fleet
    client = openai_client(url)
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert completion.model == MODEL
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("length", "stop")
    assert completion.usage.completion_tokens > 0

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "Say hello."}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes and finishes[-1] in ("length", "stop")


def test_the_models_the_servers_list_are_the_gateway_s(fleet):
    url, _ = fleet
    models = openai_client(url).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_a_server_killed_mid_run_loses_no_request(fleet):
    """Requests from four threads while one server is killed: every one is answered (a
    request that meets the dead server before its first token is retried on the other), and
    the gateway stops routing to the dead one."""
    url, servers = fleet
    outcomes = []
    lock = threading.Lock()

    def worker(n):
        for i in range(6):
            try:
                message = ask_anthropic(url, f"Thread {n}, question {i}: name a fruit.")
                outcome = ("ok", message.content[0].text)
            except anthropic.APIStatusError as e:
                outcome = ("error", e.status_code, e.body)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    # Let a few requests through, then kill one server while the rest are on their way.
    deadline = time.time() + 60
    while len(outcomes) < 4 and time.time() < deadline:
        time.sleep(0.05)
    servers[0].kill()
    for t in threads:
        t.join(timeout=300)
    assert len(outcomes) == 24
    failed = [o for o in outcomes if o[0] != "ok"]
    assert not failed, failed

    # The health view converges: the dead server is no longer routable, and requests go on.
    admin = urllib.request.Request(url + "/admin/servers", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    deadline = time.time() + 30
    while True:
        with urllib.request.urlopen(admin, timeout=5) as r:
            servers_view = json.load(r)["servers"]
        dead = next(s for s in servers_view if s["id"] == "llama-0")
        if dead["routable"] is False:
            break
        if time.time() > deadline:
            pytest.fail(f"the killed server still looks routable: {dead}")
        time.sleep(0.5)
    for _ in range(3):
        assert ask_anthropic(url).content[0].text
