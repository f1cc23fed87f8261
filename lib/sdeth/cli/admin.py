"""The deployment's commands: `keys` (a CURVE key directory), `status` (the milestones, or what is up on the
cluster), `render`, `down` and `reap` (the cluster's Deployments)."""
from __future__ import annotations

import sys


def _keys(a) -> int:
    from pathlib import Path
    from ..wire.auth import DEFAULT_CLIENTS, KeysError, check_clients, make_keys
    if (Path(a.dir) / "server.key_secret").exists():
        print(f"sdeth: error: {a.dir} already holds keys: choose a new directory (or delete it to replace them, "
              f"then copy the new one to every node)", file=sys.stderr)
        return 2
    try:
        names = check_clients(a.clients)
    except KeysError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2
    d = make_keys(a.dir, names)
    if names == DEFAULT_CLIENTS:
        print(f"keys in {d}: server.key(_secret), client.key(_secret), authorized/client.key; copy the directory to "
              f"both nodes and pass --keys {d} (or set SDETH_KEYS)")
    else:
        print(f"keys in {d}: server.key(_secret) and authorized/ ({', '.join(n + '.key' for n in names)}) for the "
              f"draft server's node (--keys {d}); {d}/clients/NAME for client NAME's node alone (--keys "
              f"{d}/clients/NAME): it holds no other client's secret")
    return 0


def _status(a) -> int:
    from ..study import status
    try:
        print(status.markdown(only=a.milestone), end="")
    except ValueError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2
    return 0


def cluster_command(a) -> int:
    """`render`, `down`, `reap` and `status --cluster`: the cluster's objects (place.cluster)."""
    from ..place import cluster
    try:
        if a.cmd == "down":
            names = cluster.down(a.namespace, a.context)
            print(f"scaled to 0 in {a.namespace}: {', '.join(names) or 'nothing was running'}")
            return 0
        if a.cmd == "reap":
            age, names = cluster.reap(a.namespace, a.stale_minutes, a.context)
            seen = "no controller lease" if age is None else f"controller lease renewed {age / 60:.1f} min ago"
            print(f"{seen}; scaled to 0 in {a.namespace}: {', '.join(names) or 'nothing'}")
            return 0
        if a.cmd == "status":
            c = cluster.Cluster(a.namespace, a.context, hold_lease=False)
            try:
                age, up = c.lease_age_s(), c.up()
            finally:
                c.close()
            print(f"namespace {a.namespace}: " + ("no controller lease" if age is None
                                                  else f"controller lease renewed {age / 60:.1f} min ago"))
            for d in up:
                since = f", up {d['age_s'] / 60:.0f} min" if d["age_s"] is not None else ""
                print(f"- {d['deployment']}: {d['ready']}/{d['replicas']} ready{' (GPU)' if d['gpu'] else ''}{since}")
            return 0
        import yaml
        objs = cluster.render(a.placement, a.target_node, a.draft_node, a.pair, a.target_model, a.draft_model, a.k,
                              a.image, a.namespace, keys_dir=a.keys)
        cluster.validate(objs)
        print(yaml.safe_dump_all(objs, sort_keys=False), end="")
        return 0
    except cluster.ClusterError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2


COMMANDS = {"keys": _keys, "status": _status}
