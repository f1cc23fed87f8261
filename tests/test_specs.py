"""The branch cache's one spec parser (runtime.specs, read by runtime.verdictcache.VerdictSpec): 'off', 'on' and
FANOUT[xDEPTH[xBUDGET]], and bad specs refused naming the cache, the spec and the forms."""
import pytest

from sdeth.runtime.specs import parse_branch_spec
from sdeth.runtime.verdictcache import VERDICT_DEFAULT, VerdictSpec


def test_the_verdict_cache_reads_a_spec():
    for off in ("", "off", "0"):
        assert VerdictSpec.parse(off) == VerdictSpec() and not VerdictSpec.parse(off).on
    on = VerdictSpec.parse("on")
    assert (on.fanout, on.depth, on.budget) == tuple(int(x) for x in VERDICT_DEFAULT.split("x"))
    assert VerdictSpec.parse("2x6").depth == 6 and VerdictSpec.parse("3").depth == 4
    assert VerdictSpec.parse("4x4x3").budget == 3 and VerdictSpec.parse("3").budget == 6    # budget: 2 x fanout
    for bad in ("x", "0x3", "2x0", "a", "1x2x3x4"):
        with pytest.raises(ValueError, match=rf"verdict cache '{bad}': use 'off', 'on' \({VERDICT_DEFAULT}\) or FANOUT"):
            VerdictSpec.parse(bad)


def test_the_parser_fills_depth_and_the_third_part():
    assert parse_branch_spec("off", "x", "1x1", "T") is None
    assert parse_branch_spec("3", "x", "1x1", "T") == (3, 4, 1)
    assert parse_branch_spec("on", "x", "2x5x7", "T") == (2, 5, 7)
