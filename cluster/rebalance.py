"""``vaultvec rebalance``: move partitions onto nodes that joined the service's Ray cluster, or
off nodes about to leave it (actors.control.rebalance), while the service runs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command imports Ray only when it runs
    from actors.control.rebalance import RebalanceReport


def add_command(sub: Any) -> None:
    p = sub.add_parser(
        "rebalance",
        help="move partitions onto nodes that joined, or off nodes to drain, while serving",
        description="Even out the partitions per shard pool actor over the cluster's nodes "
        "(a node that joined gets its share), moving partitions online: writes and queries go "
        "on meanwhile. With --drain, first move every partition off those nodes; new indexes "
        "avoid them until the next rebalance without them.",
    )
    p.add_argument(
        "--ray-address",
        help="the service's Ray cluster (default: $RAY_ADDRESS, else the local `vaultvec serve`)",
    )
    p.add_argument(
        "--drain",
        action="append",
        default=[],
        metavar="NODE_ID",
        help="a Ray node id to empty (repeatable); `--dry-run` lists the nodes",
    )
    p.add_argument("--dry-run", action="store_true", help="print the moves, make none")
    p.set_defaults(func=_rebalance)


def _rebalance(args: argparse.Namespace) -> int:
    import ray

    from actors.control.client import ControlClient
    from actors.control.plane import CONTROL_NAME, NAMESPACE
    from actors.errors import VaultvecError
    from cluster import runtime

    if not ray.is_initialized():
        runtime.join(args.ray_address)
    try:
        control = ControlClient(ray.get_actor(CONTROL_NAME, namespace=NAMESPACE))
    except ValueError:
        print("no vaultvec service runs on this Ray cluster", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(control.rebalance(args.drain, args.dry_run))
    except VaultvecError as exc:  # a node id that is not one, the pool not starting
        print(f"vaultvec rebalance: {exc}", file=sys.stderr)
        return 2
    print(describe(report, args.dry_run))
    return 1 if report.skipped or report.stranded else 0


def describe(report: RebalanceReport, dry_run: bool) -> str:
    """The report as a user reads it: each move, then partitions per node before and after."""
    verb = "would move" if dry_run else "moved"
    lines = [f"{verb} {len(report.moved)} partition(s)"]
    for m in report.moved:
        took = "" if dry_run else f" ({m.seconds:.2f}s)"
        lines.append(
            f"  {m.index} shard {m.shard_no}: {m.source} on node {m.source_node[:12]} -> "
            f"{m.target} on node {m.target_node[:12]}{took}"
        )
    for index, shard, why in report.skipped:
        lines.append(f"  skipped {index} shard {shard}: {why}; run rebalance again later")
    for index, shard in report.stranded:
        lines.append(
            f"  {index} shard {shard} stays on a draining node: every other pool actor holds a "
            "partition of that index already"
        )
    lines.append("partitions per node (before -> after):")
    for node in sorted(set(report.before) | set(report.after)):
        mark = "  (draining)" if node in report.draining else ""
        before, after = report.before.get(node, 0), report.after.get(node, 0)
        lines.append(f"  {node}  {before} -> {after}{mark}")
    return "\n".join(lines)
