"""The printed rows, the notes every call's JSON carries, and the closing summary."""
from __future__ import annotations

from .common import PREFILL_CHUNK, PROMPT, CONTEXT, REMOTE_LABEL, SERVER_ROWS

def draft_row(p: dict) -> str:
    cells = " ".join(f"B{q['B']}@{q['context']}: {q['step_ms']:.2f}/{q['host_ms_per_step']:.3f}" for q in p["points"])
    return f"draft_step {p['draft']} [{p['compile']}] step ms/host ms per step: {cells}"


def colocated_row(p: dict) -> str:
    return (f"colocated B={p['B']:2d} k={p['k']} TPOT p50 {p['tpot_ms']['p50']:.2f} p99 {p['tpot_ms']['p99']:.2f} "
            f"mean {p['tpot_ms']['mean']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} tok/s/GPU (draft {p['draft_ms_mean']:.2f}"
            f" + verify {p['verify_ms_mean']:.2f} ms a round)")


def pipelined_row(p: dict) -> str:
    head = f"pipelined B={p['B']} N={p['N']} [{p.get('step_policy')}]"
    if "tpot_ms" not in p:
        return f"{head}: {p.get('error') or p.get('skipped')}"
    m = p.get("model", {})
    return (f"{head}: TPOT {p['tpot_ms']['mean']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} tok/s/GPU, offered "
            f"{p['offered_mean']} (model {m.get('verified_per_round')}), speedup {p.get('speedup')}, rows "
            f"{p['server_batch']['mean']} for {p['server_streams']['live']} live, commit->draft arrived p50 "
            f"{p['timeline_ms']['sent_to_arrived']['p50']} ms ({(p.get('restart_periods') or {}).get('p50')} periods), "
            f"speedup interval {p.get('speedup_interval')}, steps {p['steps']}")


def remote_row(p: dict) -> str:
    head = f"remote B={p['B']:2d} N={p['N']:2d} k={p['k']}"
    if "tpot_ms" not in p:
        return f"{head}: {p.get('error') or p.get('skipped')}"
    s = p["split_ms_mean"]
    return (f"{head} TPOT p50 {p['tpot_ms']['p50']:.2f} p99 {p['tpot_ms']['p99']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} "
            f"tok/s/GPU ({p['gpus']} GPUs); wait {s['client_wait']:.2f} = draft {s['draft_compute']:.2f} + queue "
            f"{s['queueing']:.2f} + host {s['server_host']:.2f} + net {s['network']:.2f} ms; batch {p['server_batch']['mean']}"
            f"; t_v {p['t_v_ms']:.2f} ms (+{100 * (p['emulation']['t_v_over_intended_mean'] or 0):.1f}%)")


# ---------------------------------------------------------------- one call on the device

NOTES = [
    "Weights: random bf16 of each named shape, drawn on the GPU (runtime.randomweights); timing does not depend on "
    "their values. The draft's tokens are meaningless with random weights, so acceptance is synthetic: coins on the "
    "target side (heads with probability alpha per drafted token, accepted up to the first tails, then the target's "
    "own token), alpha 0.71 with the Qwen3-1.7B shape and 0.56 with the Qwen3-0.6B shape.",
    f"Streams run sequences from {PROMPT} to {CONTEXT} tokens (a sequence whose next round would pass {CONTEXT} ends "
    "and a new one opens; the draft prefills the new prompt between steps, the target's prefill is not charged).",
    f"remote: every point is an {REMOTE_LABEL}; the draft server has {SERVER_ROWS} cache rows (its largest batch "
    f"bucket), so N*B <= {SERVER_ROWS}: more streams need a second draft GPU or larger buckets. tokens/s per GPU "
    "counts N+1 GPUs (N targets and the draft GPU). The emulated verify waits the graph replay time of t_v(B, k) "
    "(device only): the target's host work (input copy, logits read; target.wall_ms shows it) is not in the wait.",
    "What two GPUs would add (a real target in place of the emulated one): the real verify's host work and launch "
    "jitter on the target's own GPU, a real target prefill for each new sequence, and the target's draft-server "
    "traffic on the same host as its forward; the draft GPU's figures (draft compute, queueing, server host work, "
    "batch sizes) would be the same as measured here, since the draft server already runs on its own GPU process.",
    "network (client wait - server held) is loopback TCP between processes on one host, both sides' encoding, and "
    "the time a Rounds waits in the server's socket while a draft step or a prefill runs (the server stamps a "
    "message when it reads it); a link between two hosts adds its round trip to every round.",
    f"A new sequence's prompt ({PROMPT - 1} tokens fed) is prefilled by the draft between steps, up to "
    f"{PREFILL_CHUNK} tokens (several prompts) between two steps: the streams already running wait for it, which "
    "is most of each point's TPOT p99 and of its t_v overshoot; prompt_prefill_ms (remote.server, "
    "colocated) gives one prompt's prefill.",
    "The bench's draft server admits every loopback connection (clients and clients_per_peer raised to 4096): each "
    "point's emulated targets open fresh connections, and a closed one is forgotten only after the server's TTL.",
    "t_v_over_intended: (the emulated verify's actual wait) / t_v - 1, per round; it includes the coins and the "
    "sends of End and Open for finished sequences, and the processes' scheduling on the host's CPU cores.",
]




def summary_lines(res: dict) -> list[str]:
    """The goals, the best k per B colocated, and the remote points at each B's best tokens/s per GPU."""
    out = [f"goal {r['draft']} [{r['compile']}] B={r['B']} context {r['context']}: step {r['step_ms']:.3f} ms "
           f"(goal {r['step_goal_ms']}: {'met' if r['step_met'] else 'missed'}), host {r['host_ms_per_step']:.3f} ms/step "
           f"(goal {r['host_goal_ms']}: {'met' if r['host_met'] else 'missed'})" for r in res.get("goal_check", [])]
    for part in res.get("colocated", []):
        out += [f"colocated {part['draft']} best B={b['B']}: k={b['k']} {b['tokens_per_s_per_gpu']:.0f} tok/s/GPU, "
                f"TPOT mean {b['tpot_ms_mean']:.2f} ms" for b in part["best_k"]]
    out += [f"remote best B={b['B']} N={b['N']}: k={b['k']} {b['tokens_per_s_per_gpu']:.0f} tok/s/GPU, TPOT mean "
            f"{b['tpot_ms_mean']:.2f} ms" for b in res.get("remote", {}).get("best_k", [])]
    return out
