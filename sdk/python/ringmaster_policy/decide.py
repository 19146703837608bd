"""Pure decision helpers, the same as the Rust SDK's `decide` module.

Every helper takes values a policy already has (the server list from `cluster.servers()`,
`cluster.prefix-matches()`, `cluster.prefill-backlog()`, `ring.candidates(...)`) and calls no
host function. A server is anything with the fields of the WIT `server` record as attributes
(`id`, `healthy`, `weight`, `in_flight`, `waiting`, `kv_blocks_used`, `kv_blocks_total`), which
is what componentize-py generates and what `ringmaster_policy.testing.server` builds.

Conventions: only healthy servers are ever picked; ties end with the ring order, then the
lower id, so every helper is deterministic for a given input.
"""

import math

NO_RANK = 1 << 62


def healthy(servers):
    """The healthy servers, in the order given."""
    return [s for s in servers if s.healthy]


def matched(matches, server_id):
    """How many of the request's leading prefix hashes `server_id` holds, by `matches`
    (a list of `(id, n)` pairs; a server left out holds none)."""
    for sid, n in matches:
        if sid == server_id:
            return n
    return 0


def backlog(backlogs, server_id):
    """`server_id`'s prefill backlog in prompt tokens, by `backlogs` (`(id, tokens)` pairs; a
    server left out has none)."""
    for sid, n in backlogs:
        if sid == server_id:
            return n
    return 0


def ring_rank(order, server_id):
    """Where `server_id` stands in `order` (for instance the ring's candidates for the key);
    a large number when it is not there."""
    try:
        return order.index(server_id)
    except ValueError:
        return NO_RANK


def coverage(matched_hashes, total):
    """The fraction of a request's `total` prefix hashes that `matched_hashes` covers."""
    if total <= 0:
        return 0.0
    return min(matched_hashes / total, 1.0)


def uncached_tokens(prompt_tokens, matched_hashes, total):
    """Of `prompt_tokens`, those a server holding `matched_hashes` of `total` leading prefix
    hashes still has to compute."""
    return round(prompt_tokens * (1.0 - coverage(matched_hashes, total)))


def bounded_cap(server, total_in_flight, total_weight, load_factor=1.25, slack=0):
    """The bounded-load cap `ceil(c x (total + 1) x weight / total_weight) + slack`: how many
    requests `server` may carry."""
    share = (total_in_flight + 1) * server.weight / max(total_weight, 1)
    return math.ceil(load_factor * share) + slack


def least_in_flight(servers, order=()):
    """The healthy server with the fewest requests in flight (ties: ring order, then id);
    None when none is healthy."""
    candidates = healthy(servers)
    if not candidates:
        return None
    return min(candidates, key=lambda s: (s.in_flight, ring_rank(list(order), s.id), s.id))


def cheapest_prefill(servers, matches, backlogs, prompt_tokens, prefix_hashes, order=(),
                     cache_weight=1.0, load_factor=1.25, slack=2):
    """The healthy server with room under the bounded-load cap (with `slack`) where the request
    costs the least prefill: its backlog plus the prompt, less `cache_weight` x the tokens its
    cache holds. Ties: fewer in flight, then ring order. When no server has room, the least
    loaded. None when none is healthy."""
    candidates = healthy(servers)
    if not candidates:
        return None
    order = list(order)
    total = sum(s.in_flight for s in candidates)
    weight = sum(s.weight for s in candidates)
    roomy = [s for s in candidates
             if s.in_flight < bounded_cap(s, total, weight, load_factor, slack)]
    if not roomy:
        return least_in_flight(candidates, order)

    def cost(s):
        cached = prompt_tokens - uncached_tokens(prompt_tokens, matched(matches, s.id), prefix_hashes)
        return backlog(backlogs, s.id) + prompt_tokens - cache_weight * cached

    return min(roomy, key=lambda s: (cost(s), s.in_flight, ring_rank(order, s.id), s.id))
