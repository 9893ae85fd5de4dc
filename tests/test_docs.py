"""The documentation: the site builds strictly, every Python block of the README and of the
pages runs (``tools/docs_blocks.py``) or says why not, the README stays a landing page, and
the reference names every ``TorchTrainer`` keyword."""
import glob
import inspect
import os
import subprocess
import sys

import pytest

from background import Batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import docs_blocks  # noqa: E402

# docs/bench is a link to bench/; its README is read once, as bench/README.md.
PAGES = sorted(["README.md", "bench/README.md"] + [
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                       recursive=True)
    if not os.path.relpath(path, ROOT).startswith(os.path.join("docs", "bench"))])
README_MAX_LINES = 250
BENCH_README_MAX_LINES = 400
PAGE_TIMEOUT_S = 300


def _blocks(page):
    return docs_blocks.blocks(os.path.join(ROOT, page))


def _has_runnable(page):
    try:
        return any(block.skip is None for block in _blocks(page))
    except docs_blocks.MarkError:
        return True  # its run fails with the error, as test_every_python_block... does


RUNNABLE = [page for page in PAGES if _has_runnable(page)]


def test_every_python_block_runs_or_says_why_not():
    """Every block either runs (test_the_pages_code_runs) or carries a skip mark with its
    reason (a mark without one fails in ``docs_blocks.blocks``); the marks are counted."""
    run, skipped = 0, []
    for page in PAGES:
        for block in _blocks(page):
            if block.skip is None:
                run += 1
            else:
                skipped.append(f"{page}:{block.line}: {block.skip}")
    print(f"{run} python blocks run, {len(skipped)} marked not run:\n" + "\n".join(skipped))
    assert run > len(skipped), "most blocks must run; marks are for what cannot run here"


def test_a_mark_without_a_reason_or_away_from_a_fence_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skip () -->\n```python\nx = 1\n```\n")
    with pytest.raises(docs_blocks.MarkError, match="needs its reason"):
        docs_blocks.blocks(str(page))
    page.write_text("<!-- docs-test: skip (needs a GPU) -->\n\ntext\n```python\nx = 1\n```\n")
    with pytest.raises(docs_blocks.MarkError, match="right above"):
        docs_blocks.blocks(str(page))


def test_a_failing_block_is_named_by_its_page_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# t\n```python\nx = 1\n```\n\n```python\nassert x == 2\n```\n")
    out = docs_blocks.run_page(str(page), timeout=60)
    assert out.returncode == 1 and f"FAILED block {page}:6" in out.stderr


@pytest.fixture(scope="module")
def page_runs():
    """Every page's blocks, two pages at a time (``background``), from the first test's
    start; each test waits for its own."""
    env = docs_blocks.page_env()
    batch = Batch({page: (lambda b, page=page: b.run(
        docs_blocks.page_command(os.path.join(ROOT, page)), timeout=PAGE_TIMEOUT_S, cwd=ROOT,
        env=env)) for page in RUNNABLE})
    yield batch
    batch.close()


@pytest.mark.slow
@pytest.mark.timeout(PAGE_TIMEOUT_S * len(RUNNABLE) + 60)
@pytest.mark.parametrize("page", RUNNABLE)
def test_the_pages_code_runs(page, page_runs):
    out = page_runs.result(page, PAGE_TIMEOUT_S * len(RUNNABLE))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]


def test_the_site_builds_strictly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                          "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                         text=True, timeout=240, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "trainer" / "index.html").exists()


def test_the_reference_names_every_torchtrainer_keyword():
    from raysgd import TorchTrainer

    with open(os.path.join(ROOT, "docs", "reference", "trainer.md")) as handle:
        reference = handle.read()
    keywords = [name for name in inspect.signature(TorchTrainer.__init__).parameters
                if name != "self" and not name.startswith("_")]
    missing = [name for name in keywords if f"`{name}`" not in reference]
    assert not missing, f"docs/reference/trainer.md does not describe {missing}"


def test_the_readmes_stay_short_and_link_only_inside_the_repository():
    import re

    for page, limit in (("README.md", README_MAX_LINES), ("bench/README.md",
                                                           BENCH_README_MAX_LINES)):
        with open(os.path.join(ROOT, page)) as handle:
            text = handle.read()
        assert len(text.splitlines()) <= limit, f"{page} is over {limit} lines"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            assert "://" not in target, f"{page} links outside the repository: {target}"
            path = target.split("#")[0]
            if path:
                assert os.path.exists(os.path.join(ROOT, os.path.dirname(page), path)), \
                    f"{page} links to {target}, which does not exist"


def test_every_readme_section_links_to_its_guide():
    import re

    with open(os.path.join(ROOT, "README.md")) as handle:
        sections = re.split(r"^## ", handle.read(), flags=re.M)[1:]
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"\]\((docs/[^)]+|bench/README\.md[^)]*)\)", section), \
            f"README section {title!r} links to no guide"
