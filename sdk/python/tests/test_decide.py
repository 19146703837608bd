"""The Python SDK's decision helpers: the same cases as the Rust SDK's."""

import unittest

from ringmaster_policy import decide
from ringmaster_policy.testing import server


class DecideTest(unittest.TestCase):
    def test_lookups_default_to_nothing(self):
        self.assertEqual(decide.matched([("a", 5)], "a"), 5)
        self.assertEqual(decide.matched([("a", 5)], "b"), 0)
        self.assertEqual(decide.backlog([("a", 900)], "b"), 0)
        self.assertEqual(decide.ring_rank(["b", "a"], "a"), 1)
        self.assertEqual(decide.ring_rank(["b"], "a"), decide.NO_RANK)

    def test_uncached_tokens(self):
        self.assertEqual(decide.uncached_tokens(1000, 0, 10), 1000)
        self.assertEqual(decide.uncached_tokens(1000, 4, 10), 600)
        self.assertEqual(decide.uncached_tokens(1000, 12, 10), 0)
        self.assertEqual(decide.uncached_tokens(1000, 0, 0), 1000)

    def test_bounded_cap(self):
        # 4 in flight on 2 servers: ceil(1.25 x 5 / 2) = 4, plus slack 2.
        self.assertEqual(decide.bounded_cap(server("a"), 4, 2, 1.25, 2), 6)

    def test_unhealthy_servers_are_never_picked(self):
        servers = [server("a", healthy=False), server("b", in_flight=9)]
        self.assertEqual(decide.least_in_flight(servers).id, "b")
        self.assertIsNone(decide.least_in_flight([server("a", healthy=False)]))
        pick = decide.cheapest_prefill(servers, [("a", 10)], [], 1000, 10)
        self.assertEqual(pick.id, "b")

    def test_the_queue_of_prefill_work_outweighs_a_small_saving(self):
        servers = [server("a"), server("b")]
        # a holds 60 % (600 tokens) but 2,000 are queued there: b starts sooner.
        pick = decide.cheapest_prefill(servers, [("a", 6)], [("a", 2000)], 1000, 10, ["a", "b"])
        self.assertEqual(pick.id, "b")
        pick = decide.cheapest_prefill(servers, [("a", 6)], [("a", 300)], 1000, 10, ["b", "a"])
        self.assertEqual(pick.id, "a")
        # Counted 16 times, the cache outweighs the queue.
        pick = decide.cheapest_prefill(servers, [("a", 6)], [("a", 2000)], 1000, 10, ["a", "b"],
                                       cache_weight=16)
        self.assertEqual(pick.id, "a")

    def test_ties_follow_the_ring(self):
        servers = [server("a"), server("b"), server("c")]
        pick = decide.cheapest_prefill(servers, [], [], 100, 0, ["c", "a", "b"])
        self.assertEqual(pick.id, "c")


if __name__ == "__main__":
    unittest.main()
