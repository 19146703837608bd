"""A scripted OpenAI chat-completions server for the coding-agent tests: no model, a script.

Asked with a shell tool on offer and no tool result yet, it calls that tool once (streamed as
vLLM streams calls, or whole) to print a marker; asked with the tool's result, it answers
with a sentence that quotes what the tool printed. Anything else (an agent's side requests:
titles, summaries) gets a short text answer. It reports prompt tokens and, for a prompt that
begins as an earlier one began, the shared part as cached (by whole 64-byte blocks of the
rendered prompt), so a test can see a conversation keep its cache. Every request it got is
kept with its cached tokens, for the test to read at /requests.

Run: python3 scripted_server.py PORT MARKER
"""

import http.server
import json
import sys
import threading
import time

# The shell tools the agents offer: Claude Code's and Codex's.
SHELL_TOOLS = {"Bash": "command", "exec_command": "cmd", "shell": "command"}
BLOCK = 64


class State:
    def __init__(self, marker):
        self.marker = marker
        self.requests = []
        self.prompts = []
        self.lock = threading.Lock()


def rendered(body):
    """The prompt as one string, as a server would render it (roles and text in order)."""
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role')}:{content or ''}")
        for call in message.get("tool_calls") or []:
            parts.append(json.dumps(call.get("function", {}), sort_keys=True))
    return "\n".join(parts)


def cached_tokens(state, prompt):
    """Tokens (4 bytes each) of `prompt`'s longest block-aligned prefix seen before."""
    best = 0
    with state.lock:
        for earlier in state.prompts:
            n = 0
            limit = min(len(earlier), len(prompt))
            while n + BLOCK <= limit and earlier[n : n + BLOCK] == prompt[n : n + BLOCK]:
                n += BLOCK
            best = max(best, n)
        state.prompts.append(prompt)
    return best // 4


def shell_tool(body):
    for tool in body.get("tools") or []:
        name = (tool.get("function") or {}).get("name")
        if name in SHELL_TOOLS:
            return name, SHELL_TOOLS[name]
    return None


def tool_output(body):
    for message in body.get("messages", []):
        if message.get("role") == "tool":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):
        pass

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/requests":
            with self.state.lock:
                return self.send_json(200, self.state.requests)
        if self.path.startswith("/v1/models"):
            return self.send_json(200, {"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "test"}]})
        self.send_json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/chat/completions":
            return self.send_json(404, {"error": {"message": f"no {self.path}", "type": "not_found"}})
        prompt = rendered(body)
        cached = cached_tokens(self.state, prompt)
        with self.state.lock:
            self.state.requests.append({"body": body, "cached_tokens": cached})
        usage = {
            "prompt_tokens": max(1, len(prompt) // 4),
            "completion_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        shell = shell_tool(body)
        output = tool_output(body)
        if shell and output is None:
            name, argument = shell
            arguments = json.dumps({argument: f"echo {self.state.marker}"})
            return self.answer(body, None, (name, arguments), usage)
        if output is not None:
            text = f"The tool printed: {output.strip()}"
        else:
            text = "ok"
        return self.answer(body, text, None, usage)

    def answer(self, body, text, call, usage):
        created = int(time.time())
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            finish = "stop"
            if call:
                message["tool_calls"] = [{"id": "call_scripted_1", "type": "function",
                                          "function": {"name": call[0], "arguments": call[1]}}]
                finish = "tool_calls"
            return self.send_json(200, {"id": "chatcmpl-scripted", "object": "chat.completion", "created": created,
                                        "model": body.get("model"), "usage": usage,
                                        "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(delta, finish=None, with_usage=None):
            value = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": created,
                     "model": body.get("model"), "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if with_usage is not None:
                value = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": created,
                         "model": body.get("model"), "choices": [], "usage": with_usage}
            self.write_chunk(b"data: " + json.dumps(value).encode() + b"\n\n")

        chunk({"role": "assistant", "content": ""})
        if call:
            chunk({"tool_calls": [{"index": 0, "id": "call_scripted_1", "type": "function",
                                   "function": {"name": call[0], "arguments": ""}}]})
            half = len(call[1]) // 2
            for piece in (call[1][:half], call[1][half:]):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            chunk({}, "tool_calls")
        else:
            for word in text.split(" "):
                chunk({"content": word + " "})
            chunk({}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk(None, with_usage=usage)
        self.write_chunk(b"data: [DONE]\n\n")
        self.write_chunk(b"")

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def main():
    port, marker = int(sys.argv[1]), sys.argv[2]
    Handler.state = State(marker)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
