"""python-safety's decision, tested natively: python -m unittest discover -s tests"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import policy  # noqa: E402


class PolicyTest(unittest.TestCase):
    def test_a_pattern_in_any_case_is_found_and_named(self):
        patterns = policy.patterns_of(None)
        self.assertEqual(policy.blocked_by("please DROP TABLE users", patterns), "drop table")
        self.assertEqual(policy.blocked_by("x; rm -rf / now", patterns), "rm -rf /")

    def test_clean_text_and_empty_patterns_pass(self):
        self.assertIsNone(policy.blocked_by("a table for two", policy.patterns_of(None)))
        self.assertIsNone(policy.blocked_by("anything", policy.patterns_of(" , ,\n")))
        self.assertEqual(policy.blocked_by("the SECRET word", policy.patterns_of("nope\n secret ")),
                         "secret")


if __name__ == "__main__":
    unittest.main()
