"""The pytest plugin (entry point ``pytest11``), run with pytester on real tests on the CPU: a marked test
that leaves tensors alive, grows them across repeated calls, or peaks too high fails with site, holder and
fix."""

from __future__ import annotations

import pytest

# Runs whose tests fail a check go to a fresh interpreter (runpytest_subprocess): the failure message's holder
# search then walks a small heap, not this test session's.

pytest_plugins = ["pytester"]

LEAKY = """
import pytest, torch

CACHE = []

@pytest.mark.torchmem(max_leak="64KiB")
def test_leaves_a_tensor():
    CACHE.append(torch.ones(1024, 1024))  # KEPT

@pytest.mark.torchmem(max_leak="64KiB")
def test_frees_what_it_makes():
    x = torch.ones(1024, 1024)
    assert float((x * 2).sum()) == 2 * 1024 * 1024

@pytest.mark.torchmem(repeat=4, max_leak="64KiB")
def test_grows_per_call():
    CACHE.append(torch.ones(512, 512))  # GROWS

@pytest.mark.torchmem(repeat=4, max_leak="64KiB")
def test_builds_a_cache_once():
    if not hasattr(test_builds_a_cache_once, "table"):
        test_builds_a_cache_once.table = torch.ones(1024, 1024)  # first call only

@pytest.mark.torchmem(max_peak="1MiB")
def test_peaks_too_high():
    x = torch.ones(1024, 1024)
    del x

def test_unmarked_leak_is_not_checked():
    CACHE.append(torch.ones(1024, 1024))
"""


def test_marked_tests_fail_with_site_holder_and_fix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3, failed=3)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*test_leaves_a_tensor left 4.00 MiB allocated on cpu (max_leak 64.00 KiB)*",
            "*test_grows_per_call grows memory on cpu by 1.00 MiB per call over 4 calls*",
            "*test_peaks_too_high peaked at 4.00 MiB above its start on cpu*(max_peak 1.00 MiB)*",
        ]
    )
    text = (pytester.path / "test_leaky.py").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if "# KEPT" in t)
    assert f"test_leaky.py:{line} in test_leaves_a_tensor(): 1 storage, 4.00 MiB still alive" in out
    grows = next(i for i, t in enumerate(text, 1) if "# GROWS" in t)
    assert f"test_leaky.py:{grows}" in out and "accumulates" in out
    assert "test_leaky.CACHE[" in out  # the holder
    assert "fix:" in out


def test_the_option_checks_every_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_suite="""
import torch
KEEP = []
def test_a():
    KEEP.append(torch.ones(256, 256))
def test_b():
    torch.ones(256, 256).sum()
"""
    )
    plain = pytester.runpytest("-p", "no:cacheprovider", "-q")
    plain.assert_outcomes(passed=2)
    checked = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--torchmem")
    checked.assert_outcomes(passed=1, failed=1)
    checked.stdout.fnmatch_lines(["*test_a left 256.00 KiB allocated on cpu (max_leak 0 B)*"])
    loose = pytester.runpytest("-p", "no:cacheprovider", "-q", "--torchmem", "--torchmem-max-leak=1MiB")
    loose.assert_outcomes(passed=2)


def test_the_fixture_checks_a_callable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fix="""
import collections, torch

def test_bounded(torchmem_check):
    recent = collections.deque(maxlen=2)
    r = torchmem_check(lambda: recent.append(torch.ones(1024)), repeat=6, max_leak="1KiB")
    assert r.calls == 6 and not r.failed

def test_unbounded(torchmem_check):
    seen = []
    torchmem_check(lambda: seen.append(torch.ones(1024)), repeat=6, max_leak="1KiB")

def test_bad_size(torchmem_check):
    torchmem_check(lambda: None, max_leak="lots")
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_unbounded: <lambda> grows memory on cpu by 4.00 KiB per call over 6 calls*",
            "*torchmem: *max_leak must be a size in bytes or like '1MiB', not 'lots'*",
        ]
    )


def test_a_bad_marker_fails_its_test_with_a_clear_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
import pytest
@pytest.mark.torchmem(max_leek="1MiB")
def test_typo():
    pass
@pytest.mark.torchmem(repeat=0)
def test_zero():
    pass
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "unknown argument(s) ['max_leek']; it takes max_leak, max_peak, repeat, device" in out
    assert "repeat must be a positive integer, not 0" in out
    assert "During handling" not in out
