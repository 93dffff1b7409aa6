"""CPU-seconds per query on each node of a multi-node Ray cluster, by process role: what a
given query load costs each node, so that the nodes it needs follow (docs/deployment.md).

A ``ray.cluster_utils.Cluster`` of ``--nodes`` Ray nodes on this machine (one logical CPU each,
as tests/cluster runs it) serves vaultvec on a directory store they share: Serve's proxy on the
head, one gateway replica per node, one shard pool actor per node. An index of ``--n``
clustered ``--dim``-dimensional vectors with ``--shards`` partitions (default: one per node) is
trained (automatic n_lists). The cluster first idles for ``--seconds``; then ``--clients``
concurrent clients send single top-10 queries at automatic probing for ``--seconds``, and
again queries in batches of ``--batch``. Every process of each node (the node's raylet and the
processes it started; the head also owns GCS and what this script started for the cluster) is
read from /proc before and after each run. Printed per node and process role: the CPU-seconds
per query, less what the node spends idle over the same time (Ray's and the service's
periodic work, shown on its own as CPU-ms per second), and the queries per second reached (all
nodes share this machine's cores, so the CPU per query, not the rate, carries over to a real
cluster).

    flock /tmp/vaultvec-ray.lock .venv/bin/python benchmarks/cluster_cost.py \\
        [--nodes 3] [--shards 3] [--n 200000] [--clients 8] [--seconds 20] [--batch 100]
"""

from __future__ import annotations

import argparse
import itertools
import os
import threading
import time
from typing import Any

import common
import httpx
import numpy as np
import psutil

from cluster.client import generate_key
from tests.cluster.support import SMALL_NODES_APP
from tests.helpers import clustered, free_port, ray_tmpdir

ROLES = ("gateway", "shards", "Serve proxy", "Ray daemons", "other")


def node_pids(cluster: Any) -> dict[int, str]:
    """pid -> the label of the node it belongs to: each raylet and its descendants (workers
    and their helpers); everything else this process started (GCS and the head's other daemons)
    counts on the head."""
    owner: dict[int, str] = {}
    nodes = cluster.list_all_nodes()
    for n, node in enumerate(nodes):
        label = "head" if node is cluster.head_node else f"worker {n}"
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        for p in [raylet, *raylet.children(recursive=True)]:
            owner[p.pid] = label
    for p in psutil.Process().children(recursive=True):
        owner.setdefault(p.pid, "head")
    return owner


def measure(
    cluster: Any, run: Any, seconds: float, clients: int
) -> tuple[int, float, dict[str, dict[str, float]]]:
    """(queries answered, seconds, node -> role -> CPU-seconds) of ``run(client, stop)`` on
    ``clients`` threads for ``seconds``."""
    owner = node_pids(cluster)
    before = common.proc_cpu()
    counts = [0] * clients
    stop = threading.Event()

    def worker(i: int) -> None:
        with httpx.Client(headers={"X-API-Key": common.API_KEY}, timeout=120) as c:
            while not stop.is_set():
                counts[i] += run(c, i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    after = common.proc_cpu()
    owner.update({p: o for p, o in node_pids(cluster).items() if p not in owner})
    cpu: dict[str, dict[str, float]] = {}
    for pid, (cmd, seconds) in after.items():
        node = owner.get(pid)
        if node is None:
            continue
        role = common.cpu_role(pid, cmd)
        spent = seconds - before.get(pid, (cmd, 0.0))[1]
        cpu.setdefault(node, dict.fromkeys(ROLES, 0.0))[role] += spent
    return sum(counts), took, cpu


def pause(client: httpx.Client, i: int) -> int:
    """The idle run's client: sends nothing."""
    time.sleep(0.05)
    return 0


def report(
    title: str,
    queries: int,
    took: float,
    cpu: dict[str, dict[str, float]],
    idle: dict[str, dict[str, float]],
    idle_s: float,
) -> None:
    """CPU-ms per query by node and role, less the idle rate over the same time; with no
    queries, the idle rate itself (CPU-ms per second)."""
    rows = []
    total = dict.fromkeys(ROLES, 0.0)
    for node in sorted(cpu, key=lambda n: (n != "head", n)):
        spent = {
            r: cpu[node][r] - idle.get(node, {}).get(r, 0.0) * took / idle_s
            if queries
            else cpu[node][r]
            for r in ROLES
        }
        for r in ROLES:
            total[r] += spent[r]
        rows.append(row(node, spent, queries or took))
    rows.append(row("all nodes", total, queries or took))
    unit = (
        "CPU-ms per query, idle subtracted (= cores per 1,000 q/s)"
        if queries
        else "CPU-ms per second idle"
    )
    rate = f"{queries:,} queries in {took:.1f}s ({queries / took:,.0f} q/s)" if queries else ""
    common.print_table(
        ["node", *ROLES, "all roles"],
        rows,
        title=f"{title}: {rate}, {unit}" if queries else f"{title}: {unit}",
    )


def row(label: str, roles: dict[str, float], per: float) -> list[str]:
    each = {r: roles[r] / per for r in ROLES}
    whole = sum(each.values())
    return [label, *(f"{each[r] * 1e3:.3f}" for r in ROLES), f"{whole * 1e3:.3f}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--shards", type=int, default=0, help="partitions (0: one per node)")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args()

    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from actors.control.plane import NAMESPACE
    from cluster.runtime import APP_NAME, wait_healthy
    from serve_app.app import build_app

    shards = args.shards or args.nodes
    x = clustered(args.n, args.dim, n_clusters=1000, seed=1)
    rng = np.random.default_rng(2)
    q = (x[rng.choice(args.n, 2000)] + rng.normal(0, 0.05, (2000, args.dim))).astype(np.float32)
    with ray_tmpdir("vvcc", RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING="0") as root:
        store = os.path.join(root, "store")
        os.mkdir(store)
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
        )
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        port = free_port()
        try:
            serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
            app = build_app(
                {
                    "storage": f"file://{store}",
                    "api_key": [common.API_KEY],
                    "gateway_replicas": args.nodes,
                    **SMALL_NODES_APP,
                    "auto_train_threshold": 10**9,
                    "recall_sample_share": 0.0,
                }
            )
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, timeout_s=300)
            client = common.connect(url)
            key = generate_key()
            idx = client.create_index(
                "cost", key, index_type="ivfflat", dimension=args.dim, n_shards=shards
            )
            common.upsert_batches(idx, x, [str(i) for i in range(args.n)], 20_000, "cost")
            took, status = common.train_and_wait(client, idx)
            print(
                f"  trained in {took:.1f}s ({status}); {args.nodes} nodes, {shards} partitions, "
                f"{args.n:,} items"
            )
            single = [common.query_body("cost", key, q[i : i + 1], 10) for i in range(len(q))]
            batches = [
                common.query_body("cost", key, q[s : s + args.batch], 10)
                for s in range(0, len(q) - args.batch + 1, args.batch)
            ]

            sent = itertools.count()  # which body goes next (each client takes the next)

            def one(c: httpx.Client, i: int, bodies: list[bytes], per: int) -> int:
                body = bodies[next(sent) % len(bodies)]
                r = c.post(url + common.QUERY, content=body, headers=common.JSON_HEADERS)
                if r.status_code != 200:
                    raise RuntimeError(f"query -> {r.status_code}: {r.text[:300]}")
                return per

            measure(cluster, lambda c, i: one(c, i, single, 1), 3.0, args.clients)  # warm-up
            _, idle_s, idle = measure(cluster, pause, args.seconds, 1)
            report("idle", 0, idle_s, idle, {}, idle_s)
            for label, bodies, per in (
                ("single queries", single, 1),
                (f"batches of {args.batch}", batches, args.batch),
            ):
                n, secs, cpu = measure(
                    cluster,
                    lambda c, i, b=bodies, p=per: one(c, i, b, p),
                    args.seconds,
                    args.clients,
                )
                report(f"{label}, {args.clients} clients", n, secs, cpu, idle, idle_s)
        finally:
            serve.shutdown()
            ray.shutdown()
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
