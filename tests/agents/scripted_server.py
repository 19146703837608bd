"""A scripted OpenAI chat-completions server for the coding-agent tests: no model, a script.

Asked with a shell tool on offer and no tool result yet, it calls that tool once (streamed as
vLLM streams calls, or whole) to print the product of two numbers it was started with
(`echo $((A * B))`): the product is in no prompt, so only a command that really ran can
bring it back. Asked with the tool's result, it answers with a sentence that quotes what the
tool printed. Anything else (an agent's side requests: titles, summaries) gets a short text
answer.

It renders each prompt as a server's chat template would (the leading system messages, then
the tools, then the conversation) and reports prompt tokens (4 characters each) and, for a
prompt that begins as an earlier one began, the shared part as cached, by whole 64-character
blocks, so a test can see how much of a conversation's prompt stayed cached. Every request it
got is kept with its rendered prompt, the length of the prompt's head (its system prompt and
tools) and its cached tokens, for the test to read at /requests.

Run: python3 scripted_server.py PORT A B
"""

import http.server
import json
import sys
import threading
import time

# The shell tools the agents offer: Claude Code's and Codex's.
SHELL_TOOLS = {"Bash": "command", "exec_command": "cmd", "shell": "command"}
# Cached prompts are counted by whole blocks of this many characters, as engines count whole
# KV blocks; a token is this many characters.
BLOCK = 64
CHARS_PER_TOKEN = 4


class State:
    def __init__(self, a, b):
        # The command the script asks for: its output is computed by the shell, not copied.
        self.command = f"echo $(({a} * {b}))"
        self.requests = []
        self.prompts = []
        self.lock = threading.Lock()


def text_of(content):
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def rendered(body):
    """The prompt as one string, as a server's chat template lays it out: the leading system
    messages, the tools, then the rest of the conversation (roles and text in order); and the
    length of its head, the system prompt and tools every turn of a conversation repeats."""
    parts = []
    messages = body.get("messages", [])
    at = 0
    while at < len(messages) and messages[at].get("role") == "system":
        parts.append(f"system:{text_of(messages[at].get('content'))}")
        at += 1
    if body.get("tools"):
        parts.append("tools:" + json.dumps(body["tools"], sort_keys=True))
    head = len("\n".join(parts))
    for message in messages[at:]:
        parts.append(f"{message.get('role')}:{text_of(message.get('content'))}")
        for call in message.get("tool_calls") or []:
            parts.append(json.dumps(call.get("function", {}), sort_keys=True))
    return "\n".join(parts), head


def cached_tokens(state, prompt):
    """Tokens of `prompt`'s longest block-aligned prefix seen before."""
    best = 0
    with state.lock:
        for earlier in state.prompts:
            n = 0
            limit = min(len(earlier), len(prompt))
            while n + BLOCK <= limit and earlier[n : n + BLOCK] == prompt[n : n + BLOCK]:
                n += BLOCK
            best = max(best, n)
        state.prompts.append(prompt)
    return best // CHARS_PER_TOKEN


def shell_tool(body):
    for tool in body.get("tools") or []:
        name = (tool.get("function") or {}).get("name")
        if name in SHELL_TOOLS:
            return name, SHELL_TOOLS[name]
    return None


def tool_output(body):
    for message in body.get("messages", []):
        if message.get("role") == "tool":
            return text_of(message.get("content"))
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
        prompt, head = rendered(body)
        cached = cached_tokens(self.state, prompt)
        with self.state.lock:
            self.state.requests.append(
                {"at": time.time(), "body": body, "prompt": prompt, "head": head, "cached_tokens": cached}
            )
        usage = {
            "prompt_tokens": max(1, len(prompt) // CHARS_PER_TOKEN),
            "completion_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        shell = shell_tool(body)
        output = tool_output(body)
        if shell and output is None:
            name, argument = shell
            arguments = json.dumps({argument: self.state.command})
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
    port, a, b = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    Handler.state = State(a, b)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
