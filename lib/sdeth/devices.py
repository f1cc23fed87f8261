"""Device profiles (params/devices/*.yaml) and the step time a profile gives a model: the model's bytes over
the memory it sits in (on-chip when weights and cache fit, off-chip otherwise), a fixed latency per layer,
and the host link's latency. Every number in a profile has its source beside it; the results that use a
profile say "emulated" (a paced replay) or "modelled" (a formula), never "measured"."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEVICES = Path(__file__).resolve().parents[2] / "params" / "devices"   # a leaf: no sdeth imports (paths.REPO's root)


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: str
    offchip_bytes: float
    offchip_Bps: float
    onchip_bytes: float = 0.0
    onchip_Bps: float = 0.0
    per_layer_s: float = 0.0
    host_link_s: float = 0.0
    sources: dict = field(default_factory=dict)
    key: str = ""

    def step_s(self, weight_bytes: float, kv_bytes: float, layers: int) -> float:
        """One decode step of a model with these bytes and layers on this device (batch 1)."""
        total = weight_bytes + kv_bytes
        if total > self.offchip_bytes + self.onchip_bytes:
            raise ProfileError(f"{self.name}: a model of {total / 1e9:.1f} GB does not fit "
                               f"({(self.offchip_bytes + self.onchip_bytes) / 1e9:.0f} GB)")
        bw = self.onchip_Bps if self.onchip_Bps and total <= self.onchip_bytes else self.offchip_Bps
        return total / bw + layers * self.per_layer_s + self.host_link_s

    def memory(self, weight_bytes: float, kv_bytes: float) -> str:
        total = weight_bytes + kv_bytes
        return "on-chip" if self.onchip_Bps and total <= self.onchip_bytes else "off-chip"


def load(name: str) -> DeviceProfile:
    """A profile by name (params/devices/<name>.yaml) or path."""
    import yaml
    p = Path(name)
    if not p.suffix:
        p = DEVICES / f"{name}.yaml"
    if not p.exists():
        known = sorted(x.stem for x in DEVICES.glob("*.yaml"))
        raise ProfileError(f"device profile {name!r}: no such file; known: {known} (params/devices/*.yaml)")
    d = yaml.safe_load(p.read_text())
    try:
        nums = {k: float(v) for k, v in d.items() if k not in ("name", "kind", "sources")}
        return DeviceProfile(key=p.stem, name=d["name"], kind=d["kind"], sources=d.get("sources", {}), **nums)
    except (TypeError, KeyError, ValueError) as e:
        raise ProfileError(f"device profile {p}: {e}") from None


def all_profiles() -> dict[str, DeviceProfile]:
    return {p.stem: load(p.stem) for p in sorted(DEVICES.glob("*.yaml"))}


# Bytes of the models the study talks about, batch 1, 512-token context: weights as stored (bf16 = 2 bytes a
# parameter, fp8 = 1) and keys and values (bf16) of the context. Parameters from the models' public configs.
SHAPES = {  # name -> (parameters, layers, kv bytes per token in bf16)
    "Qwen3-0.6B": (0.596e9, 28, 28 * 2 * 8 * 128 * 2),
    "Qwen3-1.7B": (1.72e9, 28, 28 * 2 * 8 * 128 * 2),
    "Qwen3-8B": (8.19e9, 36, 36 * 2 * 8 * 128 * 2),
    "Llama-3.1-70B": (70.6e9, 80, 80 * 2 * 8 * 128 * 2),
}


def model_bytes(shape: str, bytes_per_param: float = 2.0, context: int = 512) -> tuple[float, float, int]:
    """(weight bytes, kv bytes at `context`, layers) of a named shape."""
    if shape not in SHAPES:
        raise ProfileError(f"model shape {shape!r}: known {sorted(SHAPES)}")
    params, layers, kv_tok = SHAPES[shape]
    return params * bytes_per_param, kv_tok * context, layers
