"""python-router's decision, tested natively: python -m unittest discover -s tests"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import policy  # noqa: E402
from ringmaster_policy.testing import server  # noqa: E402


class PolicyTest(unittest.TestCase):
    def test_the_server_holding_the_prompt_wins_until_its_queue_is_long(self):
        servers = [server("a"), server("b")]
        pick = policy.choose(servers, [("a", 8)], [], 1000, 10, ["b", "a"])
        self.assertEqual(pick.id, "a")
        pick = policy.choose(servers, [("a", 8)], [("a", 5000)], 1000, 10, ["b", "a"])
        self.assertEqual(pick.id, "b")

    def test_unhealthy_servers_are_never_chosen(self):
        self.assertIsNone(policy.choose([server("a", healthy=False)], [], [], 10, 0, []))


if __name__ == "__main__":
    unittest.main()
