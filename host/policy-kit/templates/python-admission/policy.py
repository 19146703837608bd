"""{{name}}'s decision: refuse prompts over a size limit and requests when the queue is full,
queue while every server is busy, else run with the tier's priority."""

MAX_PROMPT_TOKENS = 100_000
MAX_IN_FLIGHT_PER_SERVER = 64
PRIORITY = {"premium": 3, "standard": 1}


def admit(tier, prompt_tokens, in_flight, queued, queue_capacity, servers):
    """("accept", priority), ("queue", None) or ("reject", reason)."""
    if prompt_tokens > MAX_PROMPT_TOKENS:
        return ("reject", f"a prompt of {prompt_tokens} tokens is over the "
                          f"{MAX_PROMPT_TOKENS} this gateway admits")
    if queued >= queue_capacity:
        return ("reject", "the gateway's queue is full")
    if in_flight >= servers * MAX_IN_FLIGHT_PER_SERVER:
        return ("queue", None)
    return ("accept", PRIORITY.get(tier, 0))
