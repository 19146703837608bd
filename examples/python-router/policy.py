"""python-router's decision: the healthy server where the request's prefill would start soonest
(the prompt tokens queued there plus the part of this prompt its cache does not hold)."""

from ringmaster_policy import decide


def choose(servers, matches, backlogs, prompt_tokens, prefix_hashes, order):
    """The server for a request, or None when no server is healthy."""
    return decide.cheapest_prefill(servers, matches, backlogs, prompt_tokens, prefix_hashes,
                                   order, cache_weight=1.0, slack=2)
