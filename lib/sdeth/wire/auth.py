"""CURVE on the link: each server has a key pair, each client a key pair and the server's public key; a server
serves only clients whose public key it holds. zmq's CURVE encrypts and authenticates every frame.

A key directory, one per node (on Kubernetes, a Secret mounted read-only):

    DIR/server.key, DIR/server.key_secret    the deployment's server pair (zmq.auth certificate files)
    DIR/client.key, DIR/client.key_secret    this node's pair as a client
    DIR/authorized/NAME.key                  the public keys of the clients a server serves, one file per client

`python -m sdeth keys DIR` makes a deployment key: one client pair that every node of the deployment holds, so the
key tells a deployment's peers from strangers, not one peer from another (the log names peers by address too).
`python -m sdeth keys DIR --clients a,b,c` makes one pair per named client: DIR holds the server pair and the
authorized keys (the draft server's node), DIR/clients/NAME is NAME's node directory (the server pair, since a
target worker also serves its controller; NAME's pair as client.key; the authorized keys), and no node holds
another client's secret. A server names each client by its authorized file (`key=NAME` in its log); a draft server
holds each client's sequences under that key, so another key cannot reach them (wire.draft_server).

Without a key directory the link is plain TCP: any process that reaches the port is served (the CPU testbed's
two namespaces on one machine); the workers say so in their first log line.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

ENV = "SDETH_KEYS"        # the key directory, where no --keys is given
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")    # a client's name: a file name on every system
DEFAULT_CLIENTS = ("client",)


class KeysError(ValueError):
    pass


@dataclass(frozen=True)
class Keys:
    """A node's keys, read from a key directory (module docstring). A node that only serves may lack the client
    pair (None), one that only connects the server's secret (None); using the missing half raises KeysError."""
    dir: pathlib.Path
    server_public: bytes
    server_secret: bytes | None
    client_public: bytes | None
    client_secret: bytes | None

    @classmethod
    def load(cls, path) -> "Keys":
        d = pathlib.Path(path)
        if not (d / "server.key").is_file():
            raise KeysError(f"key directory {d}: no server.key (make one with `python -m sdeth keys {d}`, or mount "
                            f"the Secret that holds it)")
        pairs = {name: zmq.auth.load_certificate(d / f"{name}.key_secret") if (d / f"{name}.key_secret").is_file()
                 else (None, None) for name in ("server", "client")}
        if pairs["server"][1] is None and pairs["client"][1] is None:
            raise KeysError(f"key directory {d}: neither server.key_secret nor client.key_secret (make one with "
                            f"`python -m sdeth keys {d}`, or mount the Secret that holds it)")
        if pairs["server"][1] is not None and not (d / "authorized").is_dir():
            raise KeysError(f"key directory {d}: no authorized/ folder of client public keys")
        server_public = pairs["server"][0] or zmq.auth.load_certificate(d / "server.key")[0]
        return cls(d, server_public, pairs["server"][1], *pairs["client"])

    @classmethod
    def from_env(cls, path=None) -> "Keys | None":
        """The keys at `path`, else at $SDETH_KEYS, else None (plain TCP)."""
        path = path or os.environ.get(ENV)
        return cls.load(path) if path else None


def check_clients(clients) -> tuple[str, ...]:
    """Client names as given (a list, or 'a,b,c'), checked: each a plain file name, none twice, not 'server'."""
    names = tuple(n.strip() for n in (clients.split(",") if isinstance(clients, str) else clients))
    bad = [n for n in names if not NAME.fullmatch(n) or n == "server"]
    if not names or bad or len(set(names)) != len(names):
        why = f"{bad[0]!r} is not a name" if bad else "no names" if not names else "a name given twice"
        raise KeysError(f"client names {','.join(names)!r}: {why}; give distinct names of letters, digits, '.', '_' "
                        f"and '-' (not 'server'), e.g. --clients target-0,target-1")
    return names


def make_keys(path, clients=DEFAULT_CLIENTS) -> pathlib.Path:
    """A key directory (module docstring). clients: the default, one deployment pair `client` that every node
    holds; any other names, one pair per client, each authorized, each in its own node directory."""
    names = check_clients(clients)
    d = pathlib.Path(path)
    (d / "authorized").mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)                     # the secret files are never readable by others, not even briefly
    try:
        zmq.auth.create_certificates(d, "server")
        if names == DEFAULT_CLIENTS:
            zmq.auth.create_certificates(d, "client")
            shutil.copy(d / "client.key", d / "authorized" / "client.key")
            return d
        for name in names:
            node = d / "clients" / name
            (node / "authorized").mkdir(parents=True)
            zmq.auth.create_certificates(node, "client")
            shutil.copy(node / "client.key", d / "authorized" / f"{name}.key")
        for name in names:
            node = d / "clients" / name
            for f in ("server.key", "server.key_secret"):
                shutil.copy(d / f, node / f)
            for f in (d / "authorized").glob("*.key"):
                shutil.copy(f, node / "authorized" / f.name)
    finally:
        os.umask(old)
    return d


class _Auth(ThreadAuthenticator):
    """zmq's authenticator, telling the server's log which peer address a refused key came from, and naming each
    admitted key by its authorized file (the peer's User-Id: its identity to the server)."""

    def __init__(self, ctx, log, authorized: pathlib.Path):
        super().__init__(ctx)
        self.server_log, self.address = log, ""
        self.names = {}
        for f in sorted(authorized.glob("*.key"), reverse=True):      # a key in two files: the first name
            self.names[zmq.auth.load_certificate(f)[0]] = f.stem

    def curve_user_id(self, client_public_key: bytes) -> str:
        z = z85.encode(client_public_key)
        return self.names.get(z, z.decode("ascii"))

    async def handle_zap_message(self, msg):
        self.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        return await super().handle_zap_message(msg)

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):
        if status_code != b"200":
            self.server_log.refused(self.address, "auth", f"CURVE key refused ({status_text.decode()}): not among "
                                                          f"the authorized client keys")
        return super()._send_zap_reply(request_id, status_code, status_text, user_id)


def secure_server(sock, keys: Keys, log) -> ThreadAuthenticator:
    """Make `sock` (not yet bound) a CURVE server that admits only the authorized keys; the authenticator
    returned must be stopped when the socket closes."""
    if keys.server_secret is None:
        raise KeysError(f"key directory {keys.dir}: no server.key_secret, so this node cannot serve under CURVE "
                        f"(a client's node directory without the server pair; use one with it)")
    auth = _Auth(sock.context, log, keys.dir / "authorized")
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.dir / "authorized"))
    sock.curve_secretkey, sock.curve_publickey = keys.server_secret, keys.server_public
    sock.curve_server = True
    return auth


def secure_client(sock, keys: Keys) -> None:
    """Make `sock` (not yet connected) a CURVE client of the keys' server."""
    if keys.client_secret is None:
        raise KeysError(f"key directory {keys.dir}: no client.key_secret, so this node cannot connect under CURVE "
                        f"(the server's directory of named clients; use DIR/clients/NAME)")
    sock.curve_secretkey, sock.curve_publickey = keys.client_secret, keys.client_public
    sock.curve_serverkey = keys.server_public


def plain_tcp_warning(bind: str) -> str:
    return (f"PLAIN TCP on {bind}: no key directory (--keys or ${ENV}), so any process that reaches this port is "
            f"served and the link is not encrypted; use keys on any network that others share")
