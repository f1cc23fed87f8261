"""Step costs from one device (Tables): a target step t(B), a verify t_v(B, k) and a draft step t_d(rows), each
interpolated between the measured points; what every point of the TPOT study (pareto) is made from."""
from __future__ import annotations

from dataclasses import dataclass


def _interp(points: dict, x: float) -> float:
    """Linear in x between measured points; the first value below them; the last two's line above them, never
    below the last value (a step does not get cheaper with more work)."""
    xs = sorted(points)
    if x <= xs[0] or len(xs) == 1:
        return points[xs[0]]
    hi = next((p for p in xs if p >= x), None)
    if hi == x:
        return points[x]
    x0, x1 = (xs[-2], xs[-1]) if hi is None else (xs[xs.index(hi) - 1], hi)
    y = points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)
    return max(y, points[xs[-1]]) if hi is None else y


@dataclass
class Tables:
    """Step costs in seconds, from one device. target_step {B: t(B)}; verify {(B, k): t_v(B, k)};
    draft_step {rows: t_d(rows)}. A missing k is linear in k through the measured ones and t_v(B, 0) = t(B)
    (extrapolated from the last two); a missing B or row count is linear between measured ones. With no verify
    entries at all, t_v(B, k) = t(B (k + 1)) (as many tokens in one forward). source: what produced the tables
    (hardware, models, "measured" or "modelled")."""
    target_step: dict
    verify: dict
    draft_step: dict
    n_layers: int
    rtt_s: float = 0.0
    host_s: float = 0.0
    source: str = "modelled"

    def __post_init__(self):
        if not self.target_step:
            raise ValueError("Tables.target_step is empty: give t(B) for at least one batch size")
        for name in ("target_step", "verify", "draft_step"):
            bad = {key: v for key, v in getattr(self, name).items() if not v > 0}
            if bad:
                raise ValueError(f"Tables.{name} has non-positive seconds {bad}: steps take time")
        if self.n_layers < 1 or self.rtt_s < 0 or self.host_s < 0:
            raise ValueError(f"n_layers {self.n_layers}, rtt_s {self.rtt_s}, host_s {self.host_s}: "
                             "need n_layers >= 1 and times >= 0")

    @property
    def measured(self) -> bool:
        return "measured" in self.source

    def t(self, batch: int) -> float:
        return _interp(self.target_step, batch)

    def t_d(self, rows: int) -> float:
        if not self.draft_step:
            raise ValueError("Tables.draft_step is empty: SD points need the draft's batch step")
        return _interp(self.draft_step, rows)

    def t_v(self, batch: int, k: int) -> float:
        if k == 0:
            return self.t(batch)
        if not self.verify:
            return self.t(batch * (k + 1))
        batches = sorted({b for b, _ in self.verify})
        if batch in batches:
            return self._verify_at(batch, k)
        return _interp({b: self._verify_at(b, k) for b in batches}, batch)

    def _verify_at(self, batch: int, k: int) -> float:
        return _interp({0: self.t(batch), **{kk: v for (b, kk), v in self.verify.items() if b == batch}}, k)

    @classmethod
    def from_json(cls, d: dict) -> Tables:
        """From JSON's string keys: "B" for target_step and draft_step, "B,k" for verify."""
        def pair(key: str) -> tuple[int, int]:
            parts = str(key).split(",")
            if len(parts) != 2:
                raise ValueError(f"verify key {key!r} is not 'B,k' (e.g. '4,3')")
            return int(parts[0]), int(parts[1])
        return cls({int(b): float(v) for b, v in d["target_step"].items()},
                   {pair(key): float(v) for key, v in d.get("verify", {}).items()},
                   {int(r): float(v) for r, v in d.get("draft_step", {}).items()},
                   int(d["n_layers"]), float(d.get("rtt_s", 0.0)), float(d.get("host_s", 0.0)),
                   str(d.get("source", "modelled")))

    def to_json(self) -> dict:
        return {"target_step": {str(b): v for b, v in sorted(self.target_step.items())},
                "verify": {f"{b},{k}": v for (b, k), v in sorted(self.verify.items())},
                "draft_step": {str(r): v for r, v in sorted(self.draft_step.items())},
                "n_layers": self.n_layers, "rtt_s": self.rtt_s, "host_s": self.host_s, "source": self.source}
