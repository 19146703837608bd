"""python-router: a Ringmaster router in Python (componentize-py). The decision itself lives in
policy.py, which imports nothing generated, so `python -m unittest` tests it without Wasm;
this file only asks the host and answers."""

import wit_world
from wit_world.imports import cluster, ring

import policy


class WitWorld(wit_world.WitWorld):
    def route(self, req):
        servers = cluster.servers()
        hashes = req.prefix_hash_count()
        matches = cluster.prefix_matches() if hashes else []
        backlogs = cluster.prefill_backlog()
        order = ring.candidates(req.routing_key(), len(servers))
        server = policy.choose(servers, matches, backlogs, req.prompt_tokens(), hashes, order)
        if server is None:
            return wit_world.Decision_Reject("no healthy GPU server")
        return wit_world.Decision_Route(server.id)
