"""The Python code blocks of the README and the documentation pages, and how they run.

Every ```` ```python ```` block of a page runs, in order, in one fresh Python process whose
blocks share one namespace, from the repository root, with ``RAY_ADDRESS=local`` (a block's
``ray.init()`` starts a Ray of its own). A block that cannot run here (a GPU, a cluster
address, cloud credentials) has this line right above its fence, with the reason::

    <!-- docs-test: skip (needs a GPU) -->

``python tools/docs_blocks.py PAGE...`` runs the pages' blocks and says which failed;
``tests/test_docs.py`` runs every page so and fails on a block that is neither run nor
marked with a reason.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARK = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s*\((?P<why>.*)\)\s*-->\s*$")
LOOSE_MARK = re.compile(r"^\s*<!--\s*docs-test", re.IGNORECASE)  # a mark line, well-formed or not


class MarkError(ValueError):
    """A ``docs-test`` comment that is not a skip mark with a reason right above a fence."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    code: str
    skip: Optional[str]  # the reason it is not run, or None


def _fences(lines: List[str]):
    """(opening line index, closing line index, language) of each fenced block."""
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        yield i, end, language.lower()
        i = end + 1


def blocks(page: str) -> List[Block]:
    """The page's Python blocks, each with its skip reason (None: it runs)."""
    with open(page, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    found, marks_used = [], set()
    fences = list(_fences(lines))
    for start, end, language in fences:
        if language not in ("python", "py"):
            continue
        above = start - 1
        mark = MARK.match(lines[above]) if above >= 0 else None
        why = None
        if mark:
            why = mark.group("why").strip()
            if not why:
                raise MarkError(f"{page}:{above + 1}: a skip mark needs its reason: "
                                "<!-- docs-test: skip (needs a GPU) -->")
            marks_used.add(above)
        indent = len(lines[start]) - len(lines[start].lstrip())
        code = "\n".join(line[indent:] for line in lines[start + 1:end])
        found.append(Block(page, start + 1, code, why))
    for index, line in enumerate(lines):
        if LOOSE_MARK.search(line) and index not in marks_used and "```" not in line:
            if not any(start < index < end for start, end, _ in fences):
                raise MarkError(f"{page}:{index + 1}: a docs-test comment must be "
                                "'<!-- docs-test: skip (reason) -->' right above a ```python "
                                "fence")
    return found


def script(page_blocks: List[Block]) -> str:
    """One program running the page's runnable blocks in order, in one namespace; a failing
    block is named by its page and line."""
    parts = ["import sys, traceback", "_ns = {'__name__': '__main__'}"]
    for block in page_blocks:
        if block.skip is not None:
            continue
        where = f"{block.page}:{block.line}"
        parts.append(
            f"print('--- block {where}', flush=True)\n"
            f"try:\n"
            f"    exec(compile({block.code!r}, {where!r}, 'exec'), _ns)\n"
            f"except BaseException:\n"
            f"    traceback.print_exc()\n"
            f"    print('FAILED block {where}', file=sys.stderr, flush=True)\n"
            f"    sys.exit(1)")
    return "\n".join(parts) + "\n"


def page_command(page: str) -> Optional[List[str]]:
    """The command that runs ``page``'s blocks, or None when it has none to run."""
    page_blocks = blocks(page)
    if not any(block.skip is None for block in page_blocks):
        return None
    return [sys.executable, "-c", script(page_blocks)]


def page_env(base: Optional[dict] = None) -> dict:
    return {**(base or os.environ), "RAY_ADDRESS": "local",
            "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, (base or os.environ).get(
                "PYTHONPATH", "")) if p)}


def run_page(page: str, timeout: float = 300) -> Optional[subprocess.CompletedProcess]:
    command = page_command(page)
    if command is None:
        return None
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT, env=page_env())


def main(argv: List[str]) -> int:
    failed = 0
    for page in argv:
        out = run_page(page)
        if out is None:
            print(f"{page}: no block to run")
        elif out.returncode == 0:
            print(f"{page}: ok")
        else:
            failed += 1
            print(f"{page}: FAILED\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
