"""The branch caches' one spec parser: the outcome cache (pipelined draft) and the verdict cache (draft server) read
'off', 'on' and FANOUT[xDEPTH[xTHIRD]] alike, and refuse bad specs naming the cache, the spec and the forms."""
import pytest

from sdeth.runtime.streamdraft import CACHE_DEFAULT, CacheSpec
from sdeth.runtime.verdictcache import VERDICT_DEFAULT, VerdictSpec


@pytest.mark.parametrize("spec_cls, default, third", [(CacheSpec, CACHE_DEFAULT, "ranks"),
                                                      (VerdictSpec, VERDICT_DEFAULT, "budget")])
def test_both_caches_read_a_spec_alike(spec_cls, default, third):
    for off in ("", "off", "0"):
        assert spec_cls.parse(off) == spec_cls() and not spec_cls.parse(off).on
    on = spec_cls.parse("on")
    assert (on.fanout, on.depth, getattr(on, third)) == tuple(int(x) for x in default.split("x"))
    assert spec_cls.parse("2x6").depth == 6 and spec_cls.parse("3").depth == 4
    assert getattr(spec_cls.parse("4x4x3"), third) == 3
    what = "outcome cache" if spec_cls is CacheSpec else "verdict cache"
    for bad in ("x", "0x3", "2x0", "a", "1x2x3x4"):
        with pytest.raises(ValueError, match=rf"{what} '{bad}': use 'off', 'on' \({default}\) or FANOUT"):
            spec_cls.parse(bad)
