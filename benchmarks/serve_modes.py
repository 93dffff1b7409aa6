"""Single queries and many clients under Serve's stock settings, under vaultvec's default
(Serve's fast path, cluster/fastpath.py, and the same-node channel to the shards,
actors/pool/channel.py), under the default with every shard call through Ray ("ray-calls") and
under the default serving HTTPS ("tls": HAProxy terminates TLS with a certificate made for the
run, clients on kept-alive connections), side by side in one run.

Each mode runs in its own interpreter (Serve reads its switches at import): a private local Ray
+ Serve running vaultvec (benchmarks/common.py), one ``--n`` x 128 index (trained), the bare
/floor app of bench_service.py on the same Serve, then:

* single requests, sequential on one keep-alive connection, interleaved: GET /v1/health (no-op),
  the query's body POSTed to /floor/body (same-body POST no-op), to /floor/hop (that plus one
  no-op Ray call per shard: the floor), to /floor/socket (that, the no-op sent over a Unix
  socket instead, as the channel sends it), and the real query -> p50/p99;
* where a single query's time goes: the service's own stages (GET /v1/metrics, whose
  ``vaultvec_request_stage_seconds`` the gateway records) over the sequential queries;
* CPU per request by process (Linux /proc) for a query, a get and an upsert of 10, each
  sent ``--single`` times in a row;
* 1, 8 and 32 concurrent clients sending single queries, and 32 clients mixing reads and writes
  (3 queries, 1 get, 1 upsert of 10 items in 5) -> requests/s and p50/p99.

    flock /tmp/vaultvec-ray.lock .venv/bin/python benchmarks/serve_modes.py [--order ...] [--check]

Bars (docs/performance.md): default single-query p50 <= 0.5x stock and <= 1.3x the floor
under the default; 32-client QPS default >= 3x stock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import common
import orjson
from common import CPU_COLUMNS, CpuMeter

from cluster import fastpath
from cluster.client import generate_key
from tests.helpers import clustered, run_threads

# stock: Serve's and Ray's own settings; default: vaultvec serve's; ray-calls: the default with
# the same-node channel off (VAULTVEC_LOCAL_CHANNEL=false), every shard call through Ray; tls:
# the default over HTTPS (--tls-cert/--tls-key).
MODES = ("stock", "default", "ray-calls", "tls")
CLIENTS = (1, 8, 32)
QUERY_ROUTE = 'route="/v1/vectors/query"'
REPORT_S = 6.0  # gateway replicas push their series to the control plane every 5 s


def query_seconds(client: Any) -> dict[str, float]:
    """The service's seconds so far in each stage of the query route, and in all of it
    ("request"), with the number of queries ("count")."""
    r = client.http.get("/v1/metrics")
    r.raise_for_status()
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if QUERY_ROUTE not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("vaultvec_request_stage_seconds_sum"):
            out[name.split('stage="')[1].split('"')[0]] = float(value)
        elif name.startswith("vaultvec_request_duration_seconds_sum"):
            out["request"] = float(value)
        elif name.startswith("vaultvec_request_duration_seconds_count"):
            out["count"] = float(value)
    return out


def stage_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean milliseconds per query in each stage between two :func:`query_seconds`."""
    n = after.get("count", 0.0) - before.get("count", 0.0)
    if n <= 0:
        return {}
    return {
        name: (after[name] - before.get(name, 0.0)) * 1e3 / n for name in after if name != "count"
    }


def pct(xs: list[float], p: float) -> float:
    """The ``p``th percentile of seconds ``xs``, in milliseconds."""
    return common.pct(xs, p) * 1e3


def sequential(calls: dict[str, Callable[[int], Any]], n: int) -> dict[str, list[float]]:
    for i in range(20):  # warm-up
        for call in calls.values():
            call(i)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(n):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call(i)
            times[name].append(time.perf_counter() - t0)
    return times


def concurrent(url: str, clients: int, seconds: float, work: Callable[[Any, int], None]) -> dict:
    """``clients`` threads, each with its own connection, calling ``work`` for ``seconds``."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(c: int) -> None:
        mine = []
        with common.connect(url) as client:
            i = c * 100_000
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                work(client, i)
                mine.append(time.perf_counter() - t0)
                i += 1
        with lock:
            lat.extend(mine)

    run_threads(run, clients)
    return {"qps": len(lat) / seconds, "p50": pct(lat, 50), "p99": pct(lat, 99)}


def child(mode: str, n: int, single: int, seconds: float) -> dict[str, Any]:
    """One mode, in this interpreter: the service, the floor, the measurements."""
    if mode == "stock":  # Serve's and Ray's own settings: the switches off, the limits unset
        for name, value in fastpath.ENV.items():
            if value == "1":
                os.environ[name] = "0"
            else:
                os.environ.pop(name, None)
    fastpath.apply(mode != "stock")
    from bench_service import deploy_floor  # imports ray.serve: after the switches

    x = clustered(n, 128, seed=1)
    ids = [str(i) for i in range(n)]
    service = common.running_service(local_channel=mode != "ray-calls", **tls_settings(mode))
    with service as svc, common.connect(svc.url) as client:
        key = generate_key()
        idx = client.create_index("modes", key, dimension=128)
        common.upsert_batches(idx, x, ids, 10_000, "index")
        common.train_and_wait(client, idx)
        n_shards = len(idx.describe()["memory"]["partitions"])
        deploy_floor(n_shards)
        bodies = [common.query_body("modes", key, x[i] + 0.01, 10) for i in range(500)]
        calls = {
            "GET no-op": lambda i: common.health(client),
            "same-body POST no-op": lambda i: common.post(client, "/floor/body", bodies[i % 500]),
            "floor: POST + no-op per shard": lambda i: common.post(
                client, "/floor/hop", bodies[i % 500]
            ),
            "POST + socket no-op per shard": lambda i: common.post(
                client, "/floor/socket", bodies[i % 500]
            ),
            "query": lambda i: common.query(client, bodies[i % 500]),
        }
        time.sleep(REPORT_S)
        before = query_seconds(client)
        single_times = sequential(calls, single)
        time.sleep(REPORT_S)
        stages = stage_ms(before, query_seconds(client))
        singles = {k: {"p50": pct(v, 50), "p99": pct(v, 99)} for k, v in single_times.items()}

        def get(c: Any, i: int) -> None:
            body = {"index_name": "modes", "index_key": key, "ids": [ids[i % n]]}
            common.post(c, "/v1/vectors/get", body)

        def upsert(c: Any, i: int) -> None:
            rows = [(i * 10 + j) % n for j in range(10)]
            items = [{"id": ids[r], "vector": x[r]} for r in rows]
            common.post(
                c, "/v1/vectors/upsert", {"index_name": "modes", "index_key": key, "items": items}
            )

        def read(c: Any, i: int) -> None:
            common.query(c, bodies[i % 500])

        def mixed(c: Any, i: int) -> None:
            kind = i % 5
            if kind < 3:
                read(c, i)
            elif kind == 3:
                get(c, i)
            else:
                upsert(c, i)

        cpu = CpuMeter()
        for kind, work in {"query": read, "get": get, "upsert of 10": upsert}.items():
            with cpu.measure(kind):
                for i in range(single):
                    work(client, i)
        per_request = {
            kind: {role: ms * 1e3 / single for role, ms in cpu.median(kind).items()}
            for kind in cpu.runs
        }
        loads = {f"{c} clients, queries": concurrent(svc.url, c, seconds, read) for c in CLIENTS}
        loads["32 clients, mixed"] = concurrent(svc.url, 32, seconds, mixed)
    return {
        "mode": mode,
        "shards": n_shards,
        "single": singles,
        "stages": stages,
        "cpu": per_request,
        "load": loads,
    }


def tls_settings(mode: str) -> dict[str, str]:
    """For the tls mode: a CA made for the run (trustme), a certificate for 127.0.0.1 from it
    (the service's settings) and the CA as what every client of the run checks against."""
    if mode != "tls":
        return {}
    import tempfile

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    base = tempfile.mkdtemp(prefix="vv-tls-")
    chain, key, ca_pem = (os.path.join(base, f) for f in ("chain.pem", "key.pem", "ca.pem"))
    with open(chain, "wb") as f:
        f.write(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(key)
    ca.cert_pem.write_to_path(ca_pem)
    common.VERIFY = ca_pem
    return {"tls_cert": chain, "tls_key": key}


def run_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--n", str(args.n)]
    cmd += ["--single", str(args.single), "--seconds", str(args.seconds)]
    env = fastpath.without_ports(dict(os.environ))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
    if out.returncode or line is None:
        raise RuntimeError(f"{mode} run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return dict(json.loads(line))


FLOOR = "floor: POST + no-op per shard"
SOCKET_FLOOR = "POST + socket no-op per shard"


OTHERS = tuple(mode for mode in MODES if mode != "default")
RATIO_HEADS = "".join(f"{'/ ' + mode:>12}" for mode in OTHERS)


def ratios(figures: dict[str, float]) -> str:
    """The default's figure over each other mode's (mode -> figure), as table cells."""
    return "".join(f"{figures['default'] / figures[mode]:>11.2f}x" for mode in OTHERS)


def report(results: dict[str, dict[str, Any]]) -> dict[str, bool]:
    stock, default = results["stock"], results["default"]
    print(f"\nsingle requests, ms ({default['shards']} shards); ratios: default / the mode's")
    print(f"  {'':<32}" + "".join(f"{m + ' p50':>16}{'p99':>8}" for m in MODES) + RATIO_HEADS)
    for name in default["single"]:
        runs = {m: results[m]["single"][name] for m in MODES}
        cells = "".join(f"{r['p50']:>16.2f}{r['p99']:>8.2f}" for r in runs.values())
        print(f"  {name:<32}{cells}{ratios({m: r['p50'] for m, r in runs.items()})}")
    print("\nthe sequential queries' time in the service, by stage: mean ms per query")
    names = list(dict.fromkeys(name for mode in MODES for name in results[mode]["stages"]))
    print(f"  {'':<12}" + "".join(f"{name:>9}" for name in names))
    for mode in MODES:
        row = results[mode]["stages"]
        print(f"  {mode:<12}" + "".join(f"{row.get(name, 0.0):>9.2f}" for name in names))
    print("\nCPU per request by process, ms (HAProxy counts as the proxy)")
    print(f"  {'':<26}" + "".join(f"{c:>14}" for c in CPU_COLUMNS))
    for mode in MODES:
        for kind, roles in results[mode]["cpu"].items():
            cells = "".join(f"{roles.get(c, 0.0):>14.2f}" for c in CPU_COLUMNS)
            print(f"  {mode + ', ' + kind:<26}{cells}")
    print("\nconcurrent clients: requests/s (p50 / p99 ms); ratios: default / the mode's")
    print(f"  {'':<24}" + "".join(f"{mode:>24}" for mode in MODES) + RATIO_HEADS)
    for name in default["load"]:
        loads = {m: results[m]["load"][name] for m in MODES}
        cells = "".join(
            f"{r['qps']:>10,.0f} ({r['p50']:5.1f} /{r['p99']:6.1f})" for r in loads.values()
        )
        print(f"  {name:<24}{cells}{ratios({m: r['qps'] for m, r in loads.items()})}")
    q, fl = default["single"]["query"]["p50"], default["single"][FLOOR]["p50"]
    bars = {
        "single-query p50 default <= 0.5x stock": q <= 0.5 * stock["single"]["query"]["p50"],
        "single-query p50 default <= 1.3x the floor": q <= 1.3 * fl,
        "32-client QPS default >= 3x stock": default["load"]["32 clients, queries"]["qps"]
        >= 3 * stock["load"]["32 clients, queries"]["qps"],
    }
    print(f"\nquery p50 / floor p50 under the default: {q / fl:.2f}x")
    sock = default["single"][SOCKET_FLOOR]["p50"]
    print(f"query p50 / {SOCKET_FLOOR} p50 under the default (info): {q / sock:.2f}x")
    print("bars")
    for label, met in bars.items():
        print(f"  {'ok  ' if met else 'MISS'} {label}")
    return bars


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="items in the index")
    parser.add_argument("--single", type=int, default=400, help="sequential requests per kind")
    parser.add_argument("--seconds", type=float, default=8.0, help="per concurrent load")
    parser.add_argument(
        "--order",
        default=",".join(MODES),
        help="the order the modes run in (comma-separated; the machine's speed drifts, so a "
        "second run in another order tells drift from difference)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a bar is missed")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.single, args.seconds)))
        return 0
    common.print_environment(common.environment())
    order = args.order.split(",")
    if sorted(order) != sorted(MODES):
        parser.error(f"--order must name each of {', '.join(MODES)} once")
    results = {mode: run_child(mode, args) for mode in order}
    bars = report(results)
    print(orjson.dumps(results).decode())
    return 1 if args.check and not all(bars.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
