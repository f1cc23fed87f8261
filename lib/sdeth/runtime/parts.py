"""Where a serving loop's time goes: wall time per named part, read as milliseconds per step. The draft server
times its loop's parts (the sweep, the step, the replies, the branch planning, the prefill, the messages between
steps) and the batch drafter the parts of a step (its rows packed, its inputs copied, its forwards launched, the
wait for its tokens, their settling); `DraftServerConfig.report_s` logs them every few seconds."""
from __future__ import annotations

import collections
import time


class Parts:
    """Seconds per named part and the steps they were spent over. `t = parts.add(name, t)` closes a part begun at
    t (a time.perf_counter reading) and returns now, so that consecutive parts chain without gaps."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.counts: collections.Counter = collections.Counter()   # events and tokens beside the time (count())
        self.steps = 0
        self.since = time.perf_counter()

    def add(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.seconds[name] += now - t0
        return now

    def count(self, name: str, n: int = 1) -> None:
        """n more of a named event or quantity since the last report (e.g. the prompt tokens prefilled)."""
        if n:
            self.counts[name] += n

    def per_step(self) -> dict[str, float]:
        """ms per step of each part, largest first, and the wall time per step ('wall') they sit in."""
        n = max(self.steps, 1)
        out = {k: round(v / n * 1e3, 3) for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        out["wall"] = round((time.perf_counter() - self.since) / n * 1e3, 3)
        return out

    def line(self) -> str:
        """One log line of per_step: the wall time a step, the parts that add up to it, then the parts within a
        part (named part.sub), e.g. `1200 steps, ms a step: wall 2.910 = streams 2.470 + prefill 0.300 + ...;
        within: streams.run 2.450, draft.wait 1.790, draft.launch 0.490, ...`."""
        ms = self.per_step()
        wall = ms.pop("wall")
        top = " + ".join(f"{k} {v:.3f}" for k, v in ms.items() if "." not in k)
        within = ", ".join(f"{k} {v:.3f}" for k, v in ms.items() if "." in k)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return (f"{self.steps} steps, ms a step: wall {wall:.3f} = {top}" + (f"; within: {within}" if within else "")
                + (f"; counts: {counts}" if counts else ""))

    def reset(self, counts: bool = True) -> None:
        """A new report begins (counts=False: the time only, e.g. an idle wait dropped, the counts kept)."""
        self.seconds.clear()
        if counts:
            self.counts.clear()
        self.steps, self.since = 0, time.perf_counter()
