"""Huge pages for a rank's large tensors (raysgd.worker.huge_pages): the driver's setting,
the kernel's switch, and what a process that has not imported torch yet is told. No Ray."""
import os
import subprocess
import sys

import pytest

from raysgd.errors import ConfigError
from raysgd.worker import huge_pages
from raysgd.worker.process_start import ProcessStart


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"),
                                        ("[always] madvise never", "always"),
                                        ("always madvise [never]", "never"), ("", "")])
def test_the_kernel_mode_is_the_bracketed_word(text, mode):
    assert huge_pages.kernel_mode(text) == mode


def switch(tmp_path, text: str) -> str:
    path = tmp_path / "enabled"
    path.write_text(text)
    return str(path)


def test_the_kernel_offers_huge_pages_only_when_always_or_on_request(tmp_path):
    assert huge_pages.kernel_offers(switch(tmp_path, "always [madvise] never"))
    assert huge_pages.kernel_offers(switch(tmp_path, "[always] madvise never"))
    assert not huge_pages.kernel_offers(switch(tmp_path, "always madvise [never]"))
    assert not huge_pages.kernel_offers(str(tmp_path / "no-such-file"))  # a kernel without


@pytest.mark.parametrize("value, want", [(None, True), ("", True), ("1", True), ("on", True),
                                         ("0", False), ("OFF", False), (" false ", False)])
def test_the_driver_wants_huge_pages_unless_told_not_to(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(huge_pages.ENV, raising=False)
    else:
        monkeypatch.setenv(huge_pages.ENV, value)
    assert huge_pages.wanted() is want
    assert ProcessStart.decide().huge_pages is want


def test_a_bad_setting_says_what_to_use(monkeypatch):
    monkeypatch.setenv(huge_pages.ENV, "maybe")
    with pytest.raises(ConfigError, match="RAYSGD_HUGE_PAGES='maybe'.*use 1 .* or 0"):
        huge_pages.wanted()


ENABLE = """
import os, sys
from raysgd.worker import huge_pages
print(huge_pages.enable({want}, {path!r}), os.environ.get("THP_MEM_ALLOC_ENABLE"),
      "torch" in sys.modules)
"""


def enable_in_new_process(want: bool, path: str, user_value=None) -> str:
    """``enable`` in a fresh interpreter (this one may have imported torch): its answer, the
    variable torch would read, and whether torch got imported on the way. ``user_value``:
    the variable as the user set it for the worker, if at all."""
    env = {key: value for key, value in os.environ.items() if key != huge_pages.TORCH_ENV}
    if user_value is not None:
        env[huge_pages.TORCH_ENV] = user_value
    out = subprocess.run([sys.executable, "-c", ENABLE.format(want=want, path=path)],
                         capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


def test_a_new_process_tells_torch_before_importing_it(tmp_path):
    offered, refused = switch(tmp_path, "always [madvise] never"), str(tmp_path / "none")
    assert enable_in_new_process(True, offered) == "True 1 False"
    assert enable_in_new_process(False, offered) == "False None False"
    assert enable_in_new_process(True, refused) == "False None False"
    assert enable_in_new_process(True, offered, user_value="0") == "False 0 False"


def test_a_process_that_imported_torch_is_left_as_it_is(tmp_path, monkeypatch):
    import torch  # noqa: F401 - the case: torch already in this process
    monkeypatch.delenv(huge_pages.TORCH_ENV, raising=False)
    assert huge_pages.enable(True, switch(tmp_path, "[always] madvise never")) is False
    assert huge_pages.TORCH_ENV not in os.environ
