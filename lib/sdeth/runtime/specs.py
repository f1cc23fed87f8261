"""The one parser of branch-cache specs (the draft server's verdict cache, runtime.verdictcache.VerdictSpec; a
stored sweep's shape): "off" (or "" / "0"), "on" (the cache's default) or FANOUT[xDEPTH[xTHIRD]], each part >= 1."""
from __future__ import annotations

AHEAD = "ahead"     # the cache a pipelined request's record names when a draft server sent its verdict cache's branches
                    # ahead (the server's spec sets their shape; wire.target_worker asks, study.summary reads)


def parse_branch_spec(spec: str, what: str, default: str, third: str, third_of=lambda fanout: 1) -> tuple | None:
    """(fanout, depth, third) of `spec`, None for off. Depth defaults to 4 and the third part to third_of(fanout).
    ValueError names the spec, the cache (`what`) and the forms it takes."""
    if spec in ("", "off", "0"):
        return None
    try:
        parts = [int(x) for x in (default if spec == "on" else spec).lower().split("x")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or min(parts) < 1:
        raise ValueError(f"{what} {spec!r}: use 'off', 'on' ({default}) or FANOUT[xDEPTH[x{third}]] with each >= 1, "
                         "e.g. '2x4' or '4x4x2'")
    return tuple(parts + [4, third_of(parts[0])][len(parts) - 1:])
