"""The ``vaultvec`` command."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from actors.storage import redact_url
from cluster import fastpath, rebalance
from cluster.bulk.cli import add_commands
from serve_app.settings import Settings


def _serve(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "host": args.host,
            "port": args.port,
            "storage": args.storage,
            "ray_address": args.ray_address,
            "shards": args.shards,
            "api_key": args.api_key,
            "api_key_file": args.api_key_file,
            "tls_cert": args.tls_cert,
            "tls_key": args.tls_key,
        }.items()
        if v is not None
    }
    if args.api_key is not None:
        print(
            "warning: --api-key shows the key in the process list, where other local users can "
            "read it; prefer VAULTVEC_API_KEY or --api-key-file",
            file=sys.stderr,
            flush=True,
        )
    configured = Settings(**overrides)
    fastpath.apply(configured.serve_fast_path)  # before anything imports ray.serve
    from cluster import runtime  # imports ray.serve

    settings, generated = runtime.ensure_api_key(configured)
    url = runtime.start(settings)
    # After start: ray.init installs its own SIGTERM handler, which would exit mid-flight.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if generated:
        print(f"generated API key (kept in the data directory, mode 0600): {generated}", flush=True)
    print(f"vaultvec serving at {url} (storage {redact_url(settings.storage)})", flush=True)
    stop.wait()
    print("vaultvec shutting down", flush=True)
    runtime.stop(runtime.joins_cluster(settings))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vaultvec", description="Encrypted vector-index service on Ray Serve"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="start local Ray + Serve (or join a cluster) and serve the API"
    )
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8000)")
    serve.add_argument("--storage", help="store URL (default file://./vaultvec-data)")
    serve.add_argument(
        "--ray-address", help="join this Ray cluster (default: $RAY_ADDRESS or start local Ray)"
    )
    serve.add_argument(
        "--shards",
        type=int,
        help="shards per new index (default: one per Ray node with CPUs)",
    )
    serve.add_argument(
        "--api-key-file",
        help="read the API key(s) from this file, one per line (default: $VAULTVEC_API_KEY_FILE)",
    )
    serve.add_argument(
        "--tls-cert", help="serve HTTPS with this certificate chain (PEM; with --tls-key)"
    )
    serve.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    serve.add_argument(
        "--api-key",
        help="API key(s), comma-separated; visible to other local users in the process list: "
        "prefer $VAULTVEC_API_KEY or --api-key-file (default: generated)",
    )
    serve.set_defaults(func=_serve)
    add_commands(sub)  # bulk-query, bulk-upsert
    rebalance.add_command(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
