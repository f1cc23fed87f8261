"""Who a draft server admits (wire.server_config states the policy): connections per address, per key and in
all; sequences per owner, the reserve and fair shares. Plain data over the server's clients; no sockets."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .auth import DEFAULT_CLIENTS
from .server_config import ServerLimits

WANT_S = 5.0             # a client refused a row counts as waiting for one this long


@dataclass
class ClientState:
    ident: bytes
    peer: str
    seen: float
    key: str = ""                                   # the CURVE key's name that said Hello ('' on plain TCP)
    name: str = ""                                  # the client id it said Hello with ('' none)
    gone: float = 0.0                               # when its connection closed (0: open, or spoke since)
    active: float = 0.0                             # when it last sent anything but a Ping (its Hello included)
    waiting: list = field(default_factory=list)     # (Sequence, k, arrival time) in arrival order
    refused: list = field(default_factory=list)     # RowDrafts refused since its last Drafts

    @property
    def owner(self):
        """Whom its quotas count for: its per-client CURVE key across connections, else this connection."""
        return ("key", self.key) if owner_key(self.key) else ("conn", self.ident)

    @property
    def address(self) -> str:
        return address_of(self.peer)


def owner_key(key: str) -> bool:
    """Whether a CURVE key names one client (`sdeth keys DIR --clients a,b`), so that quotas count across its
    connections; the default deployment key (`client`, which every node of a deployment holds) names no one client,
    so there each connection is its own owner, as on plain TCP."""
    return bool(key) and key not in DEFAULT_CLIENTS


def address_of(peer: str) -> str:
    """A peer_of string's address ('' when zmq gave none)."""
    return peer.partition(" key=")[0]


def in_turn(groups: list, turn: int, cap: int) -> list:
    """Round-robin: the (client, rows) groups from position `turn` on (wrapping), each taken whole while the rows
    taken fit in `cap` (the first non-empty one always); empty groups are left out."""
    if not groups:
        return []
    start = turn % len(groups)
    taken, n = [], 0
    for key, rows in groups[start:] + groups[:start]:
        if rows and (not taken or n + len(rows) <= cap):
            taken.append((key, rows))
            n += len(rows)
    return taken


def no_room(clients: dict, lim: ServerLimits, key: str, peer: str, ttl_s: float) -> tuple[str, str]:
    """(field, why) a new connection cannot say Hello (('', '') when it can): the clients of one address, of its
    (own) key, or in all (the last: the one a full table can make room for)."""
    addr = address_of(peer)
    if addr and sum(c.address == addr for c in clients.values()) >= lim.clients_per_peer:
        return "clients_per_peer", (f"address {addr} holds {lim.clients_per_peer} connections, the most one address "
                                    f"may: send over the ones it has (one connection carries many sequences)")
    if owner_key(key) and sum(c.key == key for c in clients.values()) >= lim.clients_per_key:
        return "clients_per_key", (f"key {key} holds {lim.clients_per_key} connections, the most one key may: "
                                   f"send over the ones it has (one connection carries many sequences)")
    if len(clients) >= lim.clients:
        return "clients", (f"this server serves {lim.clients} connections, its most, and each holds sequences or "
                           f"spoke lately: close an idle one (each is forgotten after {ttl_s:.0f} s of silence), or "
                           f"use another draft server")
    return "", ""


class Shares:
    """Rows per owner: the quota, the reserve and fair shares (wire.server_config's policy)."""

    def __init__(self, lim: ServerLimits):
        self.lim = lim
        self.wanting: dict = {}          # owner -> when it was last refused a row while under its fair share (dropped
                                         # when it is admitted one, or leaves)

    def fair(self, clients: dict) -> int:
        return max(1, self.lim.sequences // max(1, len({c.owner for c in clients.values()})))

    def refusal(self, c: ClientState, clients: dict, held: int, owned: int, now: float | None = None) -> tuple:
        """(field, why) an Open of a new sequence by c is refused; ('', '') when it may have a row. held: the
        sequences held in all, owned: c's owner's (neither counting the sequence re-opened)."""
        lim, now = self.lim, now or time.time()
        fair, free = self.fair(clients), lim.sequences - held
        present = {x.owner for x in clients.values()}       # (an owner that left waits for nothing)
        self.wanting = {o: t for o, t in self.wanting.items() if now - t < WANT_S and o in present}
        others_wait = any(o != c.owner for o in self.wanting)
        if free <= 0:
            why = ("sequences", f"this server holds {lim.sequences} sequences, its most: send again later (a client "
                                f"under its fair share of {fair} gets the next free row), or use another draft server")
        elif owned >= lim.sequences_per_client:
            why = ("sequences_per_client", f"this client{' key' if c.key else ''} holds {owned} sequences, the most "
                                           f"one client may: End one first")
        elif owned >= fair and (free <= lim.reserve or others_wait):
            why = ("fair_share", f"this client holds {owned} sequences, its fair share ({lim.sequences} among "
                                 f"{len({x.owner for x in clients.values()})} clients) while "
                                 + ("others wait" if others_wait else f"{free} rows are kept for others")
                                 + ": End one first, or send again later")
        else:
            self.wanting.pop(c.owner, None)                  # admitted: it waits no longer
            return "", ""
        if owned < fair:
            self.wanting[c.owner] = now
        return why
