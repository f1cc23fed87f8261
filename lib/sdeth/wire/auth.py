"""CURVE on the link: each server has a key pair, each client a key pair and the server's public key; a server
serves only clients whose public key it holds. zmq's CURVE encrypts and authenticates every frame. One key
directory serves one deployment: its nodes share the server pair and the client pair, so a key tells a
deployment's peers from strangers, not one peer from another (the log names peers by address too).

A key directory, one per node (on Kubernetes, a Secret mounted read-only; `python -m sdeth keys DIR` makes one):

    DIR/server.key, DIR/server.key_secret    the server's pair (zmq.auth certificate files)
    DIR/client.key, DIR/client.key_secret    this node's pair as a client
    DIR/authorized/*.key                     the public keys of the clients a server serves

Without a key directory the link is plain TCP: any process that reaches the port is served (the CPU testbed's
two namespaces on one machine); the workers say so in their first log line.
"""
from __future__ import annotations

import os
import pathlib
import shutil
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

ENV = "SDETH_KEYS"        # the key directory, where no --keys is given


class KeysError(ValueError):
    pass


@dataclass(frozen=True)
class Keys:
    """A node's keys, read from a key directory (module docstring)."""
    dir: pathlib.Path
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def load(cls, path) -> "Keys":
        d = pathlib.Path(path)
        pairs = {}
        for name in ("server", "client"):
            f = d / f"{name}.key_secret"
            if not f.is_file():
                raise KeysError(f"key directory {d}: no {f.name} (make one with `python -m sdeth keys {d}`, or mount "
                                f"the Secret that holds it)")
            pairs[name] = zmq.auth.load_certificate(f)
        if not (d / "authorized").is_dir():
            raise KeysError(f"key directory {d}: no authorized/ folder of client public keys")
        return cls(d, *pairs["server"], *pairs["client"])

    @classmethod
    def from_env(cls, path=None) -> "Keys | None":
        """The keys at `path`, else at $SDETH_KEYS, else None (plain TCP)."""
        path = path or os.environ.get(ENV)
        return cls.load(path) if path else None


def make_keys(path) -> pathlib.Path:
    """A key directory whose server serves its own client: one pair for each, and the client's public key
    authorized. Copy it to every node of one deployment (the same pairs on both ends)."""
    d = pathlib.Path(path)
    (d / "authorized").mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)                     # the secret files are never readable by others, not even briefly
    try:
        for name in ("server", "client"):
            zmq.auth.create_certificates(d, name)
    finally:
        os.umask(old)
    shutil.copy(d / "client.key", d / "authorized" / "client.key")
    return d


class _Auth(ThreadAuthenticator):
    """zmq's authenticator, telling the server's log which peer address a refused key came from."""

    def __init__(self, ctx, log):
        super().__init__(ctx)
        self.server_log, self.address = log, ""

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
    auth = _Auth(sock.context, log)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.dir / "authorized"))
    sock.curve_secretkey, sock.curve_publickey = keys.server_secret, keys.server_public
    sock.curve_server = True
    return auth


def secure_client(sock, keys: Keys) -> None:
    """Make `sock` (not yet connected) a CURVE client of the keys' server."""
    sock.curve_secretkey, sock.curve_publickey = keys.client_secret, keys.client_public
    sock.curve_serverkey = keys.server_public


def plain_tcp_warning(bind: str) -> str:
    return (f"PLAIN TCP on {bind}: no key directory (--keys or ${ENV}), so any process that reaches this port is "
            f"served and the link is not encrypted; use keys on any network that others share")
