"""The README's five-minute tour as data: its code blocks, in order, as the tests that run them
read them (tests/python/test_readme_tour.py runs the shell blocks of steps 1 and 3,
tests/agents/test_simulated.py the agents' blocks of step 2).

The tour lies between `<!-- tour:begin -->` and `<!-- tour:end -->` in README.md; a block right
after a `<!-- tour:agents -->` line belongs to the agents' step, which needs Claude Code and the
Codex CLI and runs where they are installed, in a network namespace.
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
MARKER = re.compile(r"^<!-- tour:([a-z]+) -->$")


class Block:
    """One fenced block of the tour: its language, its text, and its tag (`agents` or None)."""

    def __init__(self, lang, text, tag):
        self.lang = lang
        self.text = text
        self.tag = tag

    def __repr__(self):
        return f"Block({self.lang!r}, tag={self.tag!r}, {self.text[:40]!r}…)"


def blocks(path=README):
    """The tour's blocks in order; fails loudly when the markers are missing or unbalanced."""
    with open(path) as f:
        lines = f.read().splitlines()
    marks = [i for i, line in enumerate(lines) if MARKER.match(line.strip())]
    begin = [i for i in marks if lines[i].strip() == "<!-- tour:begin -->"]
    end = [i for i in marks if lines[i].strip() == "<!-- tour:end -->"]
    if len(begin) != 1 or len(end) != 1 or begin[0] > end[0]:
        raise AssertionError(f"{path} must hold one <!-- tour:begin --> … <!-- tour:end --> span")
    out, tag, fence = [], None, None
    for line in lines[begin[0] + 1 : end[0]]:
        if fence is not None:
            if line.strip() == "```":
                out.append(Block(fence[0], "\n".join(fence[1]) + "\n", fence[2]))
                fence = None
            else:
                fence[1].append(line)
            continue
        mark = MARKER.match(line.strip())
        if mark:
            tag = mark.group(1)
        elif line.startswith("```"):
            fence = (line[3:].strip(), [], tag)
            tag = None
        elif line.strip():
            # A tag belongs to the block right after it, nothing further.
            tag = None
    if fence is not None:
        raise AssertionError(f"{path}: a code block of the tour is not closed")
    return out
