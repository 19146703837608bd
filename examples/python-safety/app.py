"""python-safety: a Ringmaster safety filter in Python (componentize-py). The decision itself
lives in policy.py, which imports nothing generated, so `python -m unittest` tests it without
Wasm; this file reads the configuration (`patterns`) once per instance and answers."""

import wit_world
from wit_world.imports import config

import policy

PATTERNS = None


def verdict(text, what):
    global PATTERNS
    if PATTERNS is None:
        PATTERNS = policy.patterns_of(config.get("patterns"))
    pattern = policy.blocked_by(text, PATTERNS)
    if pattern is None:
        return wit_world.Verdict_Allow()
    return wit_world.Verdict_Block(f'the {what} contains "{pattern}"')


class WitWorld(wit_world.WitWorld):
    def check_input(self, text):
        return verdict(text, "prompt")

    def check_output(self, window, final):
        return verdict(window, "reply")
