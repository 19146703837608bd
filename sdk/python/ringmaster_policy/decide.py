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


# ---- Disaggregated fleets: which servers split a request (ringmaster:policy@0.3.0's pairs) ----
#
# A router answers a pair with the generated bindings (`Decision_Pair(Pair(decode=...,
# prefill=..., reason=...))`); these helpers decide what goes in it.

_U64 = (1 << 64) - 1


def role_of(server):
    """A server's role as a lowercase name (`both`, `prefill` or `decode`), whether it is
    componentize-py's `Role` enum member or a string (as `testing.server` gives it)."""
    role = getattr(server, "role", "both")
    return getattr(role, "name", str(role)).lower()


def decode_servers(servers):
    """The healthy servers of `servers` that can decode a request another server prefilled."""
    return [s for s in healthy(servers) if role_of(s) == "decode"]


def least_prefill_work(candidates, matches, backlogs, prompt_tokens, total):
    """Of the healthy `candidates` (for instance `cluster.prefill-servers()`), the one with the
    least prefill work ahead for a prompt of `prompt_tokens` in `total` prefix hashes: its
    backlog plus the tokens it does not hold. Ties go to the first in the order given.
    `(server, work, uncached)`, or None when none is healthy."""
    best = None
    for s in healthy(candidates):
        uncached = uncached_tokens(prompt_tokens, matched(matches, s.id), total)
        work = backlog(backlogs, s.id) + uncached
        if best is None or work < best[1]:
            best = (s, work, uncached)
    return best


def worth_splitting(uncached_on_decode, decode_backlog, prefill_work, min_uncached_tokens,
                    wait_for_busy_prefill=False):
    """Whether a request the decode server would prefill `uncached_on_decode` tokens of is worth
    splitting by the gateway's own rule: at least `min_uncached_tokens`, and (unless
    `wait_for_busy_prefill`) a prefill server with no more work ahead (`prefill_work`) than the
    decode server would have doing the prompt itself (`decode_backlog + uncached_on_decode`)."""
    return uncached_on_decode >= min_uncached_tokens and (
        wait_for_busy_prefill or prefill_work <= decode_backlog + uncached_on_decode)


def llm_d_splits(uncached_on_decode, prompt_tokens, non_cached_tokens, min_prompt_tokens=0):
    """llm-d's prefix-based decider: split iff the decode server would compute at least
    `non_cached_tokens` of the prompt and the prompt has at least `min_prompt_tokens`."""
    return uncached_on_decode >= non_cached_tokens and prompt_tokens >= min_prompt_tokens


def dynamo_prefills_locally(effective, raw, threshold=2048, ratio=0.7):
    """NVIDIA Dynamo's `isl_bounding` rule: prefill on the decode server when the effective
    input length (the tokens it would compute) is under `threshold` and under `ratio` of the
    raw input length; split otherwise."""
    return raw > 0 and effective < threshold and effective < ratio * raw


def power_of_two(servers, seed):
    """Of two servers drawn by `seed` (a u64) from the healthy `servers`, the one with fewer
    requests in flight (SMG's and vllm-router's `power_of_two`); ties go to the first drawn.
    The same draw as the Rust SDK's. None when none is healthy."""
    candidates = healthy(servers)
    n = len(candidates)
    if n == 0:
        return None
    seed &= _U64
    first = candidates[seed % n]
    second = candidates[((seed // n + 1 + seed % n) & _U64) % n]
    return second if second.in_flight < first.in_flight else first
