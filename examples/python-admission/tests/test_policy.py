"""python-admission's decision, tested natively: python -m unittest discover -s tests"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import policy  # noqa: E402


class PolicyTest(unittest.TestCase):
    def test_runs_with_the_tiers_priority(self):
        self.assertEqual(policy.admit("premium", 100, 0, 0, 256, 4), ("accept", 3))
        self.assertEqual(policy.admit("anonymous", 100, 0, 0, 256, 4), ("accept", 0))

    def test_queues_while_busy_and_refuses_when_full_or_too_long(self):
        self.assertEqual(policy.admit("standard", 100, 256, 0, 256, 4), ("queue", None))
        self.assertEqual(policy.admit("standard", 100, 0, 256, 256, 4)[0], "reject")
        kind, reason = policy.admit("standard", 200_000, 0, 0, 256, 4)
        self.assertEqual(kind, "reject")
        self.assertIn("200000 tokens", reason)


if __name__ == "__main__":
    unittest.main()
