"""Emulated draft devices (sdeth.runtime.emulated, sdeth.devices): the real draft's tokens replayed at a
profile's pace give the same proposals, the same acceptance and the target's own output."""
import time

import pytest
import torch

from sdeth import devices
from sdeth.runtime.emulated import DraftChains, EmulatedEngine, parse_emulation
from sdeth.runtime.engine import Engine
from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
from sdeth.runtime.verify import Sampling
from sdeth.study.runs.acceptance import chains_for

from doubles import tiny_qwen3 as _tiny


def test_replayed_draft_proposes_and_is_accepted_as_the_real_one():
    target, draft = _tiny(0), _tiny(0)
    torch.manual_seed(5)
    for p in draft.parameters():
        p.data += 0.03 * torch.randn_like(p)
    prompts = [("a", list(range(3, 15))), ("b", list(range(40, 49)))]
    chains = DraftChains(chains_for(target, draft, prompts, max_new=30, depth=6))
    s = Sampling()
    for _, ids in prompts:
        ref = generate_target_only(Engine(target), ids, 30, s, None)
        real = generate_sd(Engine(target), Drafter(Engine(draft), s), ids, 30, 4, s, None)
        emu_eng = EmulatedEngine(draft, chains, step_s=0.002)
        emu = generate_sd(Engine(target), Drafter(emu_eng, s), ids, 30, 4, s, None)
        assert emu.output_ids == real.output_ids == ref.output_ids
        assert (emu.accepted_tokens, emu.rounds) == (real.accepted_tokens, real.rounds) and emu_eng.misses == 0
        assert emu.draft_s >= 0.002 * (emu.rounds * 4 - 1) * 0.9          # paced: a step per drafted token


def test_device_profiles_give_steps_from_bytes_and_say_their_sources():
    profiles = devices.all_profiles()
    assert {"h200", "a100", "corsair", "cpu-manycore"} <= set(profiles)
    for p in profiles.values():
        assert set(p.sources) >= {"offchip_Bps", "per_layer_s", "host_link_s"}, p.name
    c = profiles["corsair"]
    w8, kv, layers = devices.model_bytes("Qwen3-1.7B", 1.0)
    w16, _, _ = devices.model_bytes("Qwen3-1.7B", 2.0)
    assert c.memory(w8, kv) == "on-chip" and c.memory(w16, kv) == "off-chip"       # 1.7 GB fits 2 GB SRAM; 3.4 does not
    assert c.step_s(w8, kv, layers) < 0.2e-3 < c.step_s(w16, kv, layers)
    h = profiles["h200"]
    w, kv, layers = devices.model_bytes("Qwen3-8B")
    assert 4.5e-3 < h.step_s(w, kv, layers) < 5.6e-3                              # measured: 5.15 ms
    with pytest.raises(devices.ProfileError, match="known"):
        devices.load("tpu-v9")
    assert parse_emulation("corsair:Qwen3-1.7B:fp8") == ("corsair", "Qwen3-1.7B", 1.0)
    with pytest.raises(ValueError, match="bf16 or fp8"):
        parse_emulation("corsair:Qwen3-1.7B:int3")


def test_an_emulated_step_takes_its_time():
    draft = _tiny(1)
    chains = DraftChains(chains_for(_tiny(0), draft, [("a", list(range(3, 10)))], max_new=5, depth=3))
    e = EmulatedEngine(draft, chains, step_s=0.01, prefill_s=0.0)
    e.start(40)
    e.forward(list(range(3, 10)))
    t0 = time.perf_counter()
    e.forward([chains.by_key[e.key]["target"][0]])
    assert time.perf_counter() - t0 >= 0.0095


def test_every_draft_backend_plays_the_role():
    from sdeth.runtime.roles import DraftBackend
    draft = _tiny(1)
    chains = DraftChains(chains_for(_tiny(0), draft, [("a", list(range(3, 10)))], max_new=3, depth=2))
    for backend in (Engine(draft), Engine(draft, impl="fast"), EmulatedEngine(draft, chains, step_s=0.0)):
        assert isinstance(backend, DraftBackend), type(backend)
