"""The draft server's scheduler: which rows the next step drafts (clients in turn, round-robin, under the batch
cap), which streams and verdict-cache branches the next stream step takes, the prompt tokens fed between steps
(the prefill budget) and the branches planned after a step. It decides; the server runs the step and answers."""
from __future__ import annotations

from ..runtime.batchdraft import BatchDrafter, Sequence
from ..runtime.verdictcache import VerdictCache
from .admission import in_turn
from .server_config import DraftServerConfig
from .transport import Log


class Scheduler:
    """Turns and budgets over one BatchDrafter (and its verdict cache, when on)."""

    def __init__(self, drafter: BatchDrafter, verdicts: VerdictCache | None, cfg: DraftServerConfig, log: Log):
        """cfg: resolved (its limits too)."""
        self.drafter, self.verdicts, self.limits, self.log = drafter, verdicts, cfg.limits, log
        self.budget = cfg.prefill_budget or cfg.prefill_chunk      # prompt tokens fed between two steps
        self.turn = 0                  # round-robin: the client order's starting point for the next step
        self.stream_turn = 0           # ... and for the next stream step

    def rounds(self, clients) -> list[tuple]:
        """The rows of the next step, [(client, [(sequence, k, arrival time)])]: every waiting row whose prompt is
        fed, clients in turn from `turn`, whole clients until limits.batch rows (at least one client)."""
        groups = [(c, [w for w in c.waiting if w[0].ready]) for c in clients.values()]
        picked = in_turn(groups, self.turn, self.limits.batch)
        self.turn += 1
        return picked

    def streams(self) -> tuple[list[Sequence], list[Sequence]]:
        """The next stream step's live streams (each with room; clients in turn when limits.batch caps them) and
        the verdict cache's branches on the rows left (live streams first)."""
        by_client: dict[bytes, list] = {}
        for seq in self.drafter.streams():
            if self.may_stream(seq):
                by_client.setdefault(seq.key[0], []).append(seq)
        rows = [seq for _, seqs in in_turn(sorted(by_client.items()), self.stream_turn, self.limits.batch)
                for seq in seqs]
        self.stream_turn += 1
        return rows, self.branch_rows(self.limits.batch - len(rows))

    def may_stream(self, seq: Sequence) -> bool:
        """A stream with room that may draft its next token within the context (n + 1 tokens)."""
        return seq.room and seq.n + 1 <= self.limits.context - 1

    def branch_rows(self, room: int) -> list[Sequence]:
        """The verdict cache's branches for the next stream step (`room` rows left after its live streams)."""
        if self.verdicts is None:
            return []
        return [b for b in self.verdicts.rows(room) if b.n + 1 <= self.limits.context - 1]

    def plan(self) -> None:
        """The verdict cache's new branches on the free rows; an error there drops every branch (logged), and the
        streams serve on without them."""
        if self.verdicts is None:
            return
        try:
            self.verdicts.plan(self.drafter.streams())
        except Exception as e:         # contained: branches only, never a live stream
            self.log.line(f"verdict cache: {type(e).__name__}: {e}; its branches dropped")
            self.verdicts.evict(len(self.verdicts.branches()))

    def prefill(self) -> tuple[int, Sequence | None, str]:
        """One budget of prompt tokens fed: (tokens fed, None, ''); on an error, (0, the sequence it was feeding,
        why): the caller refuses that one, the others wait on."""
        if not self.drafter.waiting():
            return 0, None, ""
        try:
            return self.drafter.prefill(self.budget), None, ""
        except Exception as e:       # contained: the prompt it was feeding is refused, the server serves on
            # (BatchDrafter.prefill feeds the waiting prompts shortest first, each until it is fed: the one it failed
            # on is the shortest still waiting, as it was the shortest when the call began)
            seq = min(self.drafter.feeding(), key=lambda s: len(s.pending), default=None)
            return 0, seq, f"{type(e).__name__}: {e}"

    def more(self, clients) -> bool:
        """Whether a step has work: refusals to send, a round ready, a stream with room, a branch to draft."""
        return (any(c.refused or any(s.ready for s, _, _ in c.waiting) for c in clients.values())
                or any(self.may_stream(s) for s in self.drafter.streams()) or bool(self.branch_rows(1)))
