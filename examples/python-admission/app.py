"""python-admission: a Ringmaster admission policy in Python (componentize-py). The decision itself
lives in policy.py, which imports nothing generated, so `python -m unittest` tests it without
Wasm; this file only translates it to the WIT verdict."""

import wit_world

import policy


class WitWorld(wit_world.WitWorld):
    def admit(self, req, current):
        kind, value = policy.admit(req.tier(), req.prompt_tokens(), current.in_flight,
                                   current.queued, current.queue_capacity, current.servers)
        if kind == "accept":
            return wit_world.Verdict_Accept(value)
        if kind == "queue":
            return wit_world.Verdict_Queue()
        return wit_world.Verdict_Reject(wit_world.Rejection(reason=value, retry_after_ms=1000))
