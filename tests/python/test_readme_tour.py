"""The README's five-minute tour, run as written: its shell blocks (steps 1 and 3; step 2's
agents run in tests/agents/test_simulated.py), in order, in one bash, in a folder laid out as
a fresh clone's root, each block within its own time, and what each must show checked.

What stands in for what a fresh clone would do at length: `cargo build --release -p
ringmaster` is answered by a `cargo` of the test's, first on PATH, that puts the binary
RINGMASTER_BIN names where the build would (`target/release/ringmaster`), and refuses any
other cargo command, so a tour that grows another is noticed here. The clone is the files the
tour reads (`tests/traces/`). The gateway is the tour's own, on 127.0.0.1:8080 as the README
says, so that port must be free. Step 3's `ringmaster policy build` uses componentize-py from
the kit's cache (installed from PyPI on first use, as tests/run already did when it built
examples/python-router). Background jobs (the gateway) are stopped at the end, with the whole
process group.
"""

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from gateway import binary
from readme_tour import ROOT, blocks

# What a block's output must show when it runs this command (the curl lines print whatever
# the gateway answered, 4xx included, so the answers are what is checked).
EXPECTED = [
    ("/v1/messages", '"type":"message"'),
    ("/v1/chat/completions", "data: [DONE]"),
    ("python3 -m unittest", "OK"),
    ("policy test", "builtin:prefix-affinity"),
    ("policy push", "mine: now runs version"),
    ("/admin/experiments", '"mine"'),
]
# Each block's time: step 3 builds a component and replays 2,000 requests with a debug binary.
BLOCK_TIMEOUT_S = 420

CARGO_SHIM = """#!/bin/sh
# The tour test's stand-in for the README's one cargo command: the prebuilt binary.
if [ "$*" = "build --release -p ringmaster" ]; then
  mkdir -p target/release && ln -sf "{binary}" target/release/ringmaster && exit 0
fi
echo "the README tour test stands in only for 'cargo build --release -p ringmaster', not: cargo $*" >&2
exit 1
"""


def port_is_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Shell:
    """One bash that the blocks are fed to in turn, as a user types them into one shell."""

    def __init__(self, cwd, env):
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "-e"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, text, marker, timeout):
        """Feeds `text`; the output up to `marker` (echoed after it), or a failure."""
        # On a line of its own: a curl answer ends with no newline.
        self.proc.stdin.write(text + f"\nprintf '\\n%s\\n' {marker}\n")
        self.proc.stdin.flush()
        out, deadline = [], time.time() + timeout
        while True:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                # A background job (the gateway) keeps the output open after bash is gone.
                if self.proc.poll() is not None:
                    time.sleep(0.5)
                    while not self.lines.empty():
                        out.append(self.lines.get() or "")
                    pytest.fail(
                        f"the block failed (bash -e stopped, exit {self.proc.returncode}):\n{text}\n"
                        f"output:\n{''.join(out)[-4000:]}"
                    )
                if time.time() > deadline:
                    pytest.fail(f"the block did not finish within {timeout} s:\n{text}\noutput:\n{''.join(out)[-4000:]}")
                continue
            if line is None:
                line = ""
            if line.strip() == marker:
                return "".join(out)
            out.append(line)

    def stop(self):
        """Ends the shell and everything it started in the background (its process group):
        asked first, then killed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        # The group's other members (the gateway, draining) may outlive bash.
        time.sleep(1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def test_the_tour_runs_as_written_in_order():
    ringmaster = binary()
    runnable = [b for b in blocks() if b.lang == "sh" and b.tag is None]
    assert len(runnable) >= 2, runnable
    if not port_is_free(8080):
        pytest.fail("port 8080 is taken: the README's tour serves there, so this test needs it free")
    with tempfile.TemporaryDirectory() as tmp:
        clone = os.path.join(tmp, "ringmaster")
        shutil.copytree(os.path.join(ROOT, "tests", "traces"), os.path.join(clone, "tests", "traces"))
        shims = os.path.join(tmp, "shims")
        os.makedirs(shims)
        cargo = os.path.join(shims, "cargo")
        with open(cargo, "w") as f:
            f.write(CARGO_SHIM.format(binary=os.path.abspath(ringmaster)))
        os.chmod(cargo, 0o755)
        # The user's environment, less what the tour sets itself or would change its course.
        env = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith("RINGMASTER_") and k != "RINGMASTER_CACHE_DIR")
            and not k.startswith(("ANTHROPIC_", "OPENAI_"))
        }
        env["PATH"] = shims + os.pathsep + env.get("PATH", "")
        shell = Shell(clone, env)
        outputs = []
        try:
            for i, block in enumerate(runnable):
                outputs.append(shell.run(block.text, f"@@tour-block-{i}-done@@", BLOCK_TIMEOUT_S))
        finally:
            shell.stop()
        for i, (block, out) in enumerate(zip(runnable, outputs)):
            for command, shown in EXPECTED:
                if command in block.text:
                    assert shown in out, f"block {i} ran {command!r} but its output lacks {shown!r}:\n{out[-4000:]}"
        assert os.path.isfile(os.path.join(clone, "my-router", "my-router.wasm"))
        # Every expectation met a block: a tour that drops a step is noticed.
        commands = "".join(b.text for b in runnable)
        assert all(command in commands for command, _ in EXPECTED), [c for c, _ in EXPECTED if c not in commands]
