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

    def test_pair_helpers_follow_the_peers_rules(self):
        servers = [server("d1", role="decode", in_flight=3), server("w"),
                   server("d2", role="decode", in_flight=1, healthy=False)]
        self.assertEqual([s.id for s in decide.decode_servers(servers)], ["d1"])
        prefill = [server("p1", role="prefill"), server("p2", role="prefill")]
        # p2 holds half the prompt: 500 tokens to do against p1's 100 + 1000.
        best, work, uncached = decide.least_prefill_work(prefill, [("p2", 5)], [("p1", 100)],
                                                         1000, 10)
        self.assertEqual((best.id, work, uncached), ("p2", 500, 500))
        self.assertIsNone(decide.least_prefill_work([], [], [], 1000, 10))
        self.assertTrue(decide.worth_splitting(1000, 0, 500, 256))
        self.assertFalse(decide.worth_splitting(100, 0, 50, 256), "under the threshold")
        self.assertFalse(decide.worth_splitting(1000, 0, 2000, 256), "prefill busier")
        self.assertTrue(decide.worth_splitting(1000, 0, 2000, 256, True), "waits for it")
        self.assertTrue(decide.llm_d_splits(16, 10, 16, 0))
        self.assertFalse(decide.llm_d_splits(15, 10, 16, 0))
        self.assertFalse(decide.llm_d_splits(100, 10, 0, 20))
        # Dynamo: 1,000 of 10,000 tokens to compute is local; 3,000 of 4,000 is split.
        self.assertTrue(decide.dynamo_prefills_locally(1000, 10_000, 2048, 0.7))
        self.assertFalse(decide.dynamo_prefills_locally(3000, 4000, 2048, 0.7))
        self.assertFalse(decide.dynamo_prefills_locally(1500, 2000, 2048, 0.7), "over 0.7")
        self.assertIsNone(decide.power_of_two([], 1))

    def test_power_of_two_draws_as_the_rust_sdk_does(self):
        servers = [server("a", in_flight=5), server("b", in_flight=1), server("c", in_flight=3)]
        # seed 7 on 3 servers: first 7 % 3 = 1 (b), second (7 // 3 + 1 + 1) % 3 = 1 (b).
        self.assertEqual(decide.power_of_two(servers, 7).id, "b")
        # seed 3: first a, second (1 + 1 + 0) % 3 = 2 (c), which has fewer in flight.
        self.assertEqual(decide.power_of_two(servers, 3).id, "c")
        # The largest u64 wraps as Rust's wrapping_add does, never raising.
        self.assertIsNotNone(decide.power_of_two(servers, (1 << 64) - 1))

    def test_roles_read_from_the_bindings_enum(self):
        class Role:  # what componentize-py generates: an Enum member with a name
            name = "DECODE"
        self.assertEqual(decide.role_of(server("d", role=Role())), "decode")
        self.assertEqual(decide.role_of(server("w")), "both")


if __name__ == "__main__":
    unittest.main()
