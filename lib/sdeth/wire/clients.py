"""The draft server's client table: who said Hello (by routing id), when each last spoke, the take-over of a
reconnected client's sequences, the TTL sweep, and each owner's sequences for its quotas (wire.admission's
policy). The sequences themselves are the drafter's (runtime.batchdraft); this table only names their clients."""
from __future__ import annotations

import time

from ..runtime.batchdraft import BatchDrafter
from ..runtime.batchdraft import Sequence
from .admission import ClientState, Shares, address_of, no_room, owner_key
from .server_config import ServerLimits
from .transport import Log, key_of

SWEEP_S = 1.0            # how often the TTL sweep runs
GONE_S = 2.0             # a closed connection's client is forgotten this long after (unless it speaks again: a
                         # reconnection under the same routing id)


class ClientTable:
    """The clients of one draft server, by routing id (read like a dict: `ident in table`, `table[ident]`)."""

    def __init__(self, drafter: BatchDrafter, limits: ServerLimits, ttl_s: float, log: Log):
        self.drafter, self.limits, self.ttl_s, self.log = drafter, limits, ttl_s, log
        self.by_ident: dict[bytes, ClientState] = {}   # routing id -> the client that said Hello with it
        self.shares = Shares(limits)
        self.t_sweep = time.time()

    def __contains__(self, ident) -> bool:
        return ident in self.by_ident

    def __getitem__(self, ident: bytes) -> ClientState:
        return self.by_ident[ident]

    def __iter__(self):
        return iter(self.by_ident)

    def __len__(self) -> int:
        return len(self.by_ident)

    def get(self, ident: bytes) -> ClientState | None:
        return self.by_ident.get(ident)

    def values(self):
        return self.by_ident.values()

    def items(self):
        return self.by_ident.items()

    def hello(self, ident: bytes, name: str, t1: float, peer: str) -> str:
        """A new connection's client: '' once admitted (a client that said Hello before under the same client id,
        from the same address or key, takes its old connection's place), else 'field: why' it is not."""
        key = key_of(peer)
        old = next((c for c in self.by_ident.values() if name and c.name == name
                    and (c.key == key if key else c.address == address_of(peer))), None)
        if old is None:
            field_, full = no_room(self.by_ident, self.limits, key, peer, self.ttl_s)
            if field_ == "clients" and self.make_room(t1):
                field_, full = no_room(self.by_ident, self.limits, key, peer, self.ttl_s)
            if full:
                return f"{field_}: {full}"
        self.by_ident[ident] = ClientState(ident, peer, t1, key, name, active=t1)
        if old is not None:
            self.take_over(old, self.by_ident[ident])
        return ""

    def make_room(self, now: float) -> bool:
        """A full table's room for a new Hello: the client idle longest (Pings are no activity) that holds no
        sequence and has no work in flight is forgotten; a per-client key's last connection is never taken (one
        slot is reserved per key). False when there is none."""
        holding = {s.key[0] for s in self.drafter.sequences()}
        per_key: dict[str, int] = {}
        for c in self.by_ident.values():
            per_key[c.key] = per_key.get(c.key, 0) + 1
        idle = [c for c in self.by_ident.values() if c.ident not in holding and not c.waiting and not c.refused
                and not (owner_key(c.key) and per_key[c.key] <= 1)]
        victim = min(idle, key=lambda c: c.active, default=None)
        if victim is None:
            return False
        self.forget(victim, "")
        self.log.line(f"forgotten for a new client (the table of {self.limits.clients} was full): it held no "
                      f"sequence and sent nothing but Pings for {now - victim.active:.1f} s", victim.peer)
        return True

    def idle_row(self, c: ClientState, idle_s: float) -> Sequence | None:
        """The row to reclaim for c, refused one: another owner's sequence that has not drafted for idle_s, or
        whose connection has closed (none with work in flight), an owner's over its fair share before one's within
        it, the oldest idle first; only while c's owner holds less than its fair share (recounted over the clients
        there are now)."""
        fair = self.shares.fair(self.by_ident)
        if self.owned(c) >= fair:
            return None
        now = time.perf_counter()
        waiting = {id(w[0]) for x in self.by_ident.values() for w in x.waiting}
        feeding = {id(s) for s in self.drafter.feeding()}
        holder = {s.key: self.by_ident.get(s.key[0]) for s in self.drafter.sequences()}
        idle = [s for s in self.drafter.sequences() if id(s) not in waiting and id(s) not in feeding
                and (now - max(s.stepped, s.opened) >= idle_s or holder[s.key] is None or holder[s.key].gone)
                and (holder[s.key] is None or holder[s.key].owner != c.owner)]
        over = {s.key: holder[s.key] is None or self.owned(holder[s.key]) > fair for s in idle}
        return min(idle, key=lambda s: (not over[s.key], max(s.stepped, s.opened)), default=None)

    def take_over(self, old: ClientState, new: ClientState) -> None:
        """new (the same client, reconnected) takes old's sequences, waiting rounds and refusals; old is forgotten."""
        moved = self.drafter.rekey(old.ident, new.ident)
        new.waiting, new.refused = old.waiting, old.refused
        del self.by_ident[old.ident]
        if moved:
            self.log.line(f"took back {moved} sequences from its earlier connection", new.peer)

    def closed(self, ident: bytes) -> None:
        """The connection that carried ident closed (transport's monitor): its client is forgotten GONE_S later
        unless it speaks again first over a live connection (the transport drops the closed one's last messages,
        naming it again: the first close counts)."""
        c = self.by_ident.get(ident)
        if c is not None and not c.gone:
            c.gone = time.time()

    def owned(self, c: ClientState, but: str = "") -> int:
        """The sequences c's owner holds (its own key's, across its connections; else c's), less `but`."""
        mine = {i for i, o in self.by_ident.items() if o.owner == c.owner}
        return sum(1 for ident in mine for key in self.drafter.keys_of(ident) if key != (c.ident, but))

    def open_refusal(self, c: ClientState) -> tuple[str, str]:
        """(field, why) c may not open a new sequence (('', '') when it may): the owner quotas and fair shares."""
        return self.shares.refusal(c, self.by_ident, self.drafter.held(), self.owned(c))

    def expire(self) -> None:
        """Free the sequences of clients silent for ttl_s (gone without End); a client whose own work is in
        flight (a prompt being fed, a round waiting) is not silent: its TTL counts from that work's end."""
        now = time.time()
        if now - self.t_sweep < SWEEP_S:
            return
        self.t_sweep = now
        busy = {s.key[0] for s in self.drafter.feeding()}
        for ident, c in list(self.by_ident.items()):
            if c.gone and now - c.gone >= GONE_S:
                self.forget(c, "its connection closed")
            elif ident in busy or c.waiting:
                c.seen = now
            elif now - c.seen > self.ttl_s:
                self.forget(c, f"no word from the client for {self.ttl_s:.0f} s")

    def forget(self, c: ClientState, why: str) -> None:
        """c's sequences freed and its handshake forgotten (logged when it held any)."""
        keys = self.drafter.keys_of(c.ident)
        for key in keys:
            self.drafter.free(key)
        self.by_ident.pop(c.ident, None)
        if keys:
            self.log.line(f"freed {len(keys)} sequences: {why}", c.peer)
