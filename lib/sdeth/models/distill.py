"""Distil the embedded draft from the embedded target, on the target's own greedy completions.

    python -m sdeth.models.distill --out lib/sdeth/assets/embedded-draft            # CPU, ~15 min budget
    python -m sdeth.models.distill --out DIR --device cuda --prompts 6000 --train-steps 3000   # GPU recipe
    python -m sdeth.models.distill --out DIR --device cuda --init lib/sdeth/assets/embedded-draft ...
                                                                    # train a committed draft further

Recipe (deterministic for a seed): a draft of L layers initialised from the target's first L layers,
sharing the target's tied embedding / output layer (frozen) and
tokenizer; trained on ShareGPT *training-split* prompts completed greedily by the target, with
cross-entropy on the target's greedy token (what greedy acceptance needs) plus, with --kd,
forward KL to the target's full distribution (what sampled acceptance needs). Agreement is then
measured on held-out prompts (the `sharegpt` split that benchmarks use).

Only what differs from the target is written: the L layers and the final norm (float16), the draft
config and a card.json. `assemble_draft` adds the target's embeddings back.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import prompts as P

MAX_PROMPT_TOKENS = 256


def pick_layers(n_target: int, n_draft: int) -> list[int]:
    """The target's first n_draft layers. Measured before training on 12 held-out prompts (6 layers):
    first 6 agree 5.8%, first 3 + last 3 2.3%, evenly spaced 0.0%, first 5 + last 0.0%."""
    if not 1 <= n_draft <= n_target:
        raise ValueError(f"draft layers {n_draft}: must be between 1 and the target's {n_target}")
    return list(range(n_draft))


def make_draft(target, n_layers: int):
    """A draft initialised from the target: chosen layers, final norm, shared frozen embeddings."""
    import copy
    from transformers import AutoModelForCausalLM
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:n_layers]
    draft = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    src = target.model
    idx = pick_layers(target.config.num_hidden_layers, n_layers)
    for i, j in enumerate(idx):
        draft.model.layers[i].load_state_dict(src.layers[j].state_dict())
    draft.model.norm.load_state_dict(src.norm.state_dict())
    draft.model.embed_tokens.weight = src.embed_tokens.weight   # shared, frozen
    draft.tie_weights()
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft, idx


@torch.no_grad()
def greedy_completions(model, tok, prompt_ids: list[list[int]], max_new: int, batch: int, device: str,
                       desc: str = "target completions", temperature: float = 0.0) -> list[list[int]]:
    """Target's continuation of each prompt (EOS kept, nothing after it), batched; greedy unless
    temperature > 0."""
    from tqdm.auto import tqdm
    eos = tok.eos_token_id
    out: list[list[int]] = [None] * len(prompt_ids)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths together
    for s in tqdm(range(0, len(order), batch), desc=desc):
        idx = order[s:s + batch]
        L = max(len(prompt_ids[i]) for i in idx)
        ids = torch.full((len(idx), L), eos, dtype=torch.long)
        mask = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):  # left padding
            ids[r, L - len(prompt_ids[i]):] = torch.tensor(prompt_ids[i])
            mask[r, L - len(prompt_ids[i]):] = 1
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
            else dict(do_sample=False)
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                             pad_token_id=eos, eos_token_id=eos, **sampling)
        for r, i in enumerate(idx):
            c = gen[r, L:].tolist()
            out[i] = c[:c.index(eos) + 1] if eos in c else c
    return out


def _groups(seqs: list[tuple[list[int], int]], tokens_per_batch: int) -> list[list[int]]:
    """Length-bucketed groups of sequence indices, each at most tokens_per_batch once padded."""
    groups, cur, cur_max = [], [], 0
    for i in sorted(range(len(seqs)), key=lambda i: len(seqs[i][0])):
        n = len(seqs[i][0])
        if cur and max(cur_max, n) * (len(cur) + 1) > tokens_per_batch:
            groups.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    return groups + ([cur] if cur else [])


def _collate(seqs, g):
    """Right-padded ids, attention mask, and loss mask (positions whose next token is a completion token)."""
    L = max(len(seqs[i][0]) for i in g)
    ids = torch.zeros((len(g), L), dtype=torch.long)
    mask = torch.zeros((len(g), L), dtype=torch.long)
    loss_mask = torch.zeros((len(g), L), dtype=torch.bool)
    for r, i in enumerate(g):
        s, n_prompt = seqs[i]
        ids[r, :len(s)] = torch.tensor(s)
        mask[r, :len(s)] = 1
        loss_mask[r, n_prompt - 1:len(s) - 1] = True
    return ids, mask, loss_mask


def _batches(seqs, tokens_per_batch: int, rng: random.Random):
    """Endless shuffled batches for training."""
    groups = _groups(seqs, tokens_per_batch)
    while True:
        rng.shuffle(groups)
        for g in groups:
            yield _collate(seqs, g)


def train(draft, target, seqs, steps: int, minutes: float, tokens_per_batch: int, lr: float, kd: bool,
          device: str, seed: int, log_every: int = 50) -> dict:
    from tqdm.auto import tqdm
    rng = random.Random(seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warm = max(1, steps // 50)

    def lr_at(step: int, elapsed: float) -> float:
        # linear warm-up, then cosine to 0 over whichever budget (steps or minutes) ends first
        progress = max(step / steps, elapsed / (minutes * 60) if minutes else 0.0)
        return lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    draft.train()
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)
    t0, hist = time.time(), []
    batches = _batches(seqs, tokens_per_batch, rng)
    bar = tqdm(range(steps), desc="distil draft")
    for step in bar:
        ids, mask, lm = (x.to(device) for x in next(batches))
        labels = torch.roll(ids, -1, dims=1)[lm]          # next token: the target's greedy token on greedy data
        with amp:
            if kd:
                with torch.no_grad():
                    th = target.model(input_ids=ids, attention_mask=mask).last_hidden_state[lm]
                    tlogp = F.log_softmax(target.lm_head(th).float(), -1)
                labels = tlogp.argmax(-1)                 # the target's greedy token, on any data
            h = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state[lm]
            logits = draft.lm_head(h).float()
            loss = F.cross_entropy(logits, labels)
            if kd:
                loss = 0.5 * loss + 0.5 * F.kl_div(F.log_softmax(logits, -1), tlogp, log_target=True,
                                                   reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(step + 1, time.time() - t0)
        opt.step()
        if step % log_every == 0:
            acc = (logits.argmax(-1) == labels).float().mean().item()
            hist.append({"step": step, "loss": round(loss.item(), 4), "train_agreement": round(acc, 4),
                         "s": round(time.time() - t0, 1)})
            bar.set_postfix(loss=f"{loss.item():.3f}", agree=f"{acc:.3f}")
        if minutes and time.time() - t0 > minutes * 60:
            break
    draft.eval()
    return {"steps_done": step + 1, "train_seconds": round(time.time() - t0, 1), "history": hist}


@torch.no_grad()
def agreement(target, draft, seqs, device: str, batch_tokens: int = 8192) -> dict:
    """Teacher-forced agreement on the target's greedy completions.

    greedy_agreement: P(draft argmax == target's token), the per-token alpha of greedy SD.
    sampled_acceptance_t1: mean over positions of sum_x min(p(x), q(x)), the per-token alpha of
    speculative sampling at temperature 1 with a sampled draft.
    """
    hits = n = 0
    overlap = 0.0
    for g in _groups(seqs, batch_tokens):
        ids, mask, lm = (x.to(device) for x in _collate(seqs, g))
        labels = torch.roll(ids, -1, dims=1)[lm]
        dl = draft(input_ids=ids, attention_mask=mask).logits[lm].float()
        tl = target(input_ids=ids, attention_mask=mask).logits[lm].float()
        hits += (dl.argmax(-1) == labels).sum().item()
        overlap += torch.minimum(dl.softmax(-1), tl.softmax(-1)).sum(-1).sum().item()
        n += labels.numel()
    return {"greedy_agreement": round(hits / n, 4), "sampled_acceptance_t1": round(overlap / n, 4),
            "positions": n}


def build_seqs(target, tok, spec: str, max_new: int, batch: int, device: str,
               sampled_copies: int = 0, temperature: float = 0.8) -> list[tuple[list[int], int]]:
    """(prompt + completion, prompt length) pairs: one greedy completion per prompt, plus
    `sampled_copies` sampled ones (more diverse prefixes; their labels are the target's argmax,
    so they need --kd, which computes the target's logits during training)."""
    ps = P.load(spec)
    ids = [P.encode(p, tok) for p in ps]
    ids = [x for x in ids if len(x) <= MAX_PROMPT_TOKENS]
    comps = greedy_completions(target, tok, ids, max_new, batch, device)
    for c in range(sampled_copies):
        comps += greedy_completions(target, tok, ids, max_new, batch, device, f"sampled completions {c + 1}",
                                    temperature)
    return [(p + c, len(p)) for p, c in zip(ids * (1 + sampled_copies), comps) if c]


def load_data(path: Path):
    """(train, eval) sequences saved by an earlier run with the same --data file, or None."""
    if not path.exists():
        return None
    d = torch.load(path)
    return [tuple(x) for x in d["train"]], [tuple(x) for x in d["eval"]]


def card_rounds(card: dict) -> list[dict]:
    """A draft card's training rounds: its `rounds`, or, for a card of one round that predates them, that
    round as the card describes it (recipe, hardware, steps, seconds, held-out agreement before and after)."""
    return card.get("rounds") or [{k: card.get(k) for k in ("recipe", "hardware", "steps_done", "train_seconds")}
                                  | {"before": card["eval"]["before_training"]["greedy_agreement"],
                                     "greedy_agreement": card["eval"]["greedy_agreement"]}]


def init_from(draft, asset: Path) -> list[dict]:
    """Load a saved draft's layers into `draft` (its shared embeddings stay the target's); returns the
    earlier card's rounds, so the new card keeps the whole training history."""
    from safetensors.torch import load_file
    sd = {k: v.float() for k, v in load_file(str(asset / "draft.safetensors")).items()}
    missing, unexpected = draft.load_state_dict(sd, strict=False)
    if unexpected or any(not k.startswith(("model.embed_tokens", "lm_head")) for k in missing):
        raise ValueError(f"--init {asset}: its layers do not fit a {len(draft.model.layers)}-layer draft "
                         f"(unexpected {unexpected[:3]}, missing {missing[:3]}); pass the same --layers it has")
    return card_rounds(json.loads((asset / "card.json").read_text()))


def save_draft(draft, idx, out: Path, card: dict) -> None:
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.float16).cpu().contiguous() for k, v in draft.state_dict().items()
          if not k.startswith(("model.embed_tokens", "lm_head"))}
    save_file(sd, str(out / "draft.safetensors"), metadata={"layers_from_target": json.dumps(idx)})
    draft.config.to_json_file(str(out / "config.json"))
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sdeth.models.distill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for draft.safetensors, config.json, card.json")
    ap.add_argument("--layers", type=lambda v: [int(x) for x in v.split(",")], default=[6],
                    help="draft depth (target has 30); a comma list trains each on the same data into OUT/L<n>")
    ap.add_argument("--prompts", type=int, default=320, help="ShareGPT training-split prompts to complete")
    ap.add_argument("--gen-tokens", type=int, default=96, help="greedy tokens the target writes per prompt")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--train-steps", type=int, default=400)
    ap.add_argument("--train-minutes", type=float, default=8.0, help="stop training after this long (0: no limit)")
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--sampled-copies", type=int, default=0,
                    help="extra completions per prompt sampled at T=0.8 (needs --kd)")
    ap.add_argument("--kd", action="store_true", help="add forward KL to the target's full distribution")
    ap.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts for the agreement figure")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shuffle-seed", type=int, default=None, help="batch order (default: --seed)")
    ap.add_argument("--init", type=Path, default=None,
                    help="start from this saved draft (a directory with draft.safetensors and card.json) "
                         "instead of the target's first layers: train it further")
    ap.add_argument("--data", type=Path, default=None,
                    help="keep the generated sequences in this file and reuse them when it exists")
    return ap


def main(argv=None) -> dict:
    """Distil a draft of each depth in --layers on the target's own completions; returns {layers: card}."""
    ap = build_parser()
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from .embedded import prepare_embedded_target
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    t_start = time.time()
    tdir = prepare_embedded_target()
    tok = AutoTokenizer.from_pretrained(tdir)
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).to(a.device).eval().requires_grad_(False)
    if a.sampled_copies and not a.kd:
        ap.error("--sampled-copies needs --kd (sampled data is labelled with the target's argmax)")
    train_seqs, eval_seqs = _sequences(a, target, tok)
    t_data = time.time() - t_start
    cards = {}
    for n_layers in a.layers:
        out = Path(a.out) if len(a.layers) == 1 else Path(a.out) / f"L{n_layers}"
        cards[n_layers] = _distil_one(a, target, n_layers, out, train_seqs, eval_seqs, t_data)
    return cards


def _sequences(a, target, tok) -> tuple[list, list]:
    """The training and held-out sequences: the target's completions (made now, or loaded from --data)."""
    saved = load_data(a.data) if a.data else None
    if saved:
        return saved
    train_seqs = build_seqs(target, tok, f"sharegpt-train:{a.prompts}:{a.seed}", a.gen_tokens, a.gen_batch,
                            a.device, a.sampled_copies)
    eval_seqs = build_seqs(target, tok, f"sharegpt:{a.eval_prompts}:{a.seed + 1000}", 64, a.gen_batch, a.device)
    if a.data:
        a.data.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"train": train_seqs, "eval": eval_seqs}, a.data)
    return train_seqs, eval_seqs


def _distil_one(a, target, n_layers: int, out: Path, train_seqs, eval_seqs, t_data: float) -> dict:
    """One draft of n_layers: made from the target's first layers (or --init), trained, measured, saved to out;
    returns its card."""
    from .embedded import EMBEDDED_DRAFT, EMBEDDED_TARGET
    torch.manual_seed(a.seed)
    draft, idx = make_draft(target, n_layers)
    earlier = init_from(draft, a.init) if a.init else None
    draft.to(a.device)
    before = agreement(target, draft, eval_seqs, a.device)
    t_train = time.time()
    log = train(draft, target, train_seqs, a.train_steps, a.train_minutes, a.batch_tokens, a.lr, a.kd,
                a.device, a.seed if a.shuffle_seed is None else a.shuffle_seed)
    after = agreement(target, draft, eval_seqs, a.device)
    n_trained = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    card = {
        "model": EMBEDDED_DRAFT, "target": EMBEDDED_TARGET,
        "made": "distilled on the target's own greedy completions (sdeth.models.distill)",
        "layers": n_layers, "layers_from_target": idx,
        "shared_with_target": "tokenizer, tied embedding/output layer",
        "trained_params": int(n_trained), "stored_dtype": "float16",
        "recipe": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "out"},
        "train_sequences": len(train_seqs), "train_tokens": int(sum(len(s) - n for s, n in train_seqs)),
        "eval": {"prompts": f"sharegpt:{a.eval_prompts}:{a.seed + 1000} (held-out split)", "max_tokens": 64,
                 "before_training": before, **after},
        "hardware": _hw(a.device), "data_seconds": round(t_data, 1),
        **{k: v for k, v in log.items() if k != "history"},
        "total_seconds": round(t_data + time.time() - t_train, 1), "history": log["history"],
    }
    card["rounds"] = (earlier or []) + card_rounds(card)      # this round, as the card describes it
    if earlier:
        card["made"] += f"; trained further from an earlier draft ({len(card['rounds'])} rounds, see rounds)"
    save_draft(draft, idx, out, card)
    print(json.dumps({"layers": n_layers, **{k: card[k] for k in ("eval", "train_tokens", "total_seconds")}}))
    return card


def _hw(device: str) -> str:
    """The card's hardware line, from the one hardware description (sdeth.hardware)."""
    from .. import hardware
    d = hardware.describe(device)
    return f"{d['label']} (torch {d['torch']})"


if __name__ == "__main__":
    main()
