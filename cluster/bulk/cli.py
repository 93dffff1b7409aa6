"""``vaultvec bulk-query``, ``bulk-upsert``, ``export``, ``backup`` and ``restore``: argument
parsing around the bulk driver (cluster.bulk.driver), the export (cluster.bulk.export) and the
backup tool (cluster.bulk.backup)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from actors.storage.backup_format import BadBackup
from cluster import constants
from cluster.bulk import backup
from cluster.bulk.backup import BackupFailed
from cluster.bulk.driver import bulk_query, bulk_upsert
from cluster.bulk.export import export
from cluster.bulk.pipeline import exit_code, run_interruptible
from cluster.bulk.progress import Report
from cluster.bulk.transports import HttpTransport, QueryOptions, RayTransport
from cluster.client import Client
from cluster.client.errors import VaultvecClientError

EPILOG = """\
transports: http (default; the Python client: the compact array routes, base64 float32, for
batches of 64+ vectors, or --wire json/binary) or ray (--ray-address: join the Ray cluster and
call the Serve app through a DeploymentHandle, no HTTP; the API key is not used there, the
index key is verified).
Ctrl-C once: finish the batches in flight, write them and stop; twice: abort those in flight.
Re-running the same command resumes after the rows already written (see the progress file).
"""


def positive(text: str) -> int:
    """An argument that must be a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    _connection(p, index=True)
    p.add_argument("--transport", choices=("http", "ray"), default="http")
    p.add_argument(
        "--wire", choices=("auto", "json", "binary"), default="auto", help="HTTP body format"
    )
    p.add_argument(
        "--ray-address", help="Ray cluster to join with --transport ray (default: $RAY_ADDRESS)"
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        default=None,
        help=f"vectors per request ({constants.DEFAULT_BATCH:,}; bulk-query sends an input of "
        f"fewer than {constants.DEFAULT_BATCH:,} x --concurrency rows in batches of rows / "
        "--concurrency, and a resumed job keeps its batches)",
    )
    p.add_argument(
        "--concurrency",
        type=positive,
        default=constants.DEFAULT_CONCURRENCY,
        help=f"requests in flight ({constants.DEFAULT_CONCURRENCY})",
    )
    p.add_argument("--restart", action="store_true", help="ignore earlier progress, start over")


def add_commands(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    q = sub.add_parser(
        "bulk-query",
        help="query every vector of a file, results to .npy or .jsonl",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    q.add_argument("input", type=Path, help="queries: .npy, .fvecs, .jsonl or .tsv")
    q.add_argument(
        "output",
        type=Path,
        help=".npy (structured: ids, distances; np.load(path)['ids']) or .jsonl (a line per query)",
    )
    _common(q)
    q.add_argument("--top-k", type=int, default=10)
    q.add_argument("--n-probes", type=int, default=None, help="default: automatic")
    q.add_argument("--greedy", action="store_true")
    q.add_argument("--filters", help="a JSON filter applied to every query")
    q.add_argument("--metadata", action="store_true", help="include metadata (.jsonl output)")
    q.add_argument("--int-ids", action="store_true", help=".npy: ids as int64 (-1 = none)")
    q.add_argument(
        "--chunk-rows", type=int, default=100_000, help="rows per output chunk / progress record"
    )
    q.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    q.set_defaults(func=_bulk_query)

    u = sub.add_parser(
        "bulk-upsert",
        help="upsert every vector of a file",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    u.add_argument(
        "input",
        type=Path,
        help=".npy, .fvecs, .jsonl (lists, or objects with vector, id, metadata, contents) or .tsv",
    )
    _common(u)
    u.add_argument(
        "--id-column", type=int, help=".tsv: the column holding ids (e.g. 0, or -1 for the last)"
    )
    u.add_argument(
        "--id-start", type=int, default=0, help="ids = str(id_start + row) when the input has none"
    )
    u.add_argument(
        "--progress-file", type=Path, help="default: <input>.upsert-<index>.progress.json"
    )
    u.set_defaults(func=_bulk_upsert)

    e = sub.add_parser(
        "export",
        help="every item of an index (id, vector, metadata, contents) to .jsonl or .npy",
        description="Streams the index through a cursor (writes may go on). .npy: the vectors, "
        "and <name>.items.jsonl beside it with each row's id, metadata and contents. The output "
        "is plaintext, created mode 0600.",
    )
    e.add_argument("output", type=Path, help=".jsonl or .npy")
    _connection(e, index=True)
    e.add_argument("--filters", help="a JSON filter: export only the items it matches")
    e.add_argument("--page-size", type=positive, default=1000, help="items per request (1000)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    e.set_defaults(func=_export)

    b = sub.add_parser(
        "backup",
        help="an index's encrypted backup to a file (online: writes go on)",
        description="The file holds ciphertext and the plaintext header the store's catalog "
        "keeps (name, salt, key verifier, shard count); restoring it needs the index key.",
    )
    b.add_argument("output", type=Path, help="the backup file")
    _connection(b, index=True)
    b.add_argument("--overwrite", action="store_true", help="replace an existing file")
    b.set_defaults(func=_backup)

    r = sub.add_parser(
        "restore", help="restore a backup into a new index (this server or another, any store)"
    )
    r.add_argument("input", type=Path, help="the backup file")
    _connection(r, index=False)
    r.add_argument(
        "--as", dest="as_name", help="the new index's name (default: the backed-up one's)"
    )
    r.set_defaults(func=_restore)


def _connection(p: argparse.ArgumentParser, *, index: bool) -> None:
    if index:
        p.add_argument("--index", required=True, help="index name")
    p.add_argument(
        "--index-key", help="the index key, 64 hex characters (default: $VAULTVEC_INDEX_KEY)"
    )
    p.add_argument(
        "--url", default=None, help="service URL (default $VAULTVEC_URL or http://127.0.0.1:8000)"
    )
    p.add_argument("--api-key", help="API key (default: $VAULTVEC_API_KEY)")
    p.add_argument(
        "--ca-cert",
        help="https: check the server's certificate against the CA certificates in this PEM "
        "file (default: $VAULTVEC_CA_CERT, else the system's)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _index_key(args: argparse.Namespace) -> str:
    key = args.index_key or os.environ.get("VAULTVEC_INDEX_KEY")
    if not key:
        raise SystemExit("no index key: pass --index-key or set VAULTVEC_INDEX_KEY")
    return str(key)


def _server(args: argparse.Namespace) -> tuple[str, str, str | bool]:
    """The service's URL, the API key and the certificate check (arguments, else the
    environment)."""
    api_key = args.api_key or os.environ.get("VAULTVEC_API_KEY")
    if not api_key:
        raise SystemExit("no API key: pass --api-key or set VAULTVEC_API_KEY")
    url = args.url or os.environ.get("VAULTVEC_URL") or "http://127.0.0.1:8000"
    verify = args.ca_cert or os.environ.get("VAULTVEC_CA_CERT") or True
    return url, api_key.split(",")[0].strip(), verify


def _tool(args: argparse.Namespace, job: Callable[[Client, str], str]) -> int:
    """Run an export, backup or restore; its summary, or the error, on stderr."""
    key = _index_key(args)
    url, api_key, verify = _server(args)
    client = Client(url, api_key, verify=verify, timeout=600.0)
    try:
        print(job(client, key), file=sys.stderr)
        return 0
    except (VaultvecClientError, BadBackup, BackupFailed, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        client.close()


def _export(args: argparse.Namespace) -> int:
    def job(client: Client, key: str) -> str:
        n = export(
            client.index(args.index, key),
            args.output,
            filters=orjson.loads(args.filters) if args.filters else None,
            page_size=args.page_size,
            overwrite=args.overwrite,
            show_progress=not args.no_progress,
        )
        return f"exported {n:,} items of {args.index!r} to {args.output}"

    return _tool(args, job)


def _backup(args: argparse.Namespace) -> int:
    def job(client: Client, key: str) -> str:
        done = backup.backup(
            client,
            args.index,
            key,
            args.output,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
        size = args.output.stat().st_size
        return (
            f"backed up {args.index!r} ({done['header']['n_shards']} shards, "
            f"{size / 1e6:,.1f} MB) to {args.output}"
        )

    return _tool(args, job)


def _restore(args: argparse.Namespace) -> int:
    def job(client: Client, key: str) -> str:
        n = backup.restore(
            client, args.input, key, name=args.as_name, progress=not args.no_progress
        )
        return f"restored {n:,} items from {args.input}"

    return _tool(args, job)


def _transport(args: argparse.Namespace) -> Any:
    key = _index_key(args)
    if args.transport == "ray":
        address = args.ray_address or os.environ.get("RAY_ADDRESS")
        return RayTransport.connect(address, args.index, key)
    url, api_key, verify = _server(args)
    return HttpTransport(
        url,
        api_key,
        args.index,
        key,
        wire=args.wire,
        max_connections=max(16, args.concurrency),
        verify=verify,
    )


def _finish(report: Report) -> int:
    for note in report.notes:
        print(note, file=sys.stderr)
    print(report.summary(), file=sys.stderr, flush=True)
    return exit_code(report)


def _bulk_query(args: argparse.Namespace) -> int:
    include = ("distance", "metadata") if args.metadata else ("distance",)
    options = QueryOptions(
        top_k=args.top_k,
        n_probes=args.n_probes,
        filters=orjson.loads(args.filters) if args.filters else None,
        greedy=True if args.greedy else None,
        include=include,
    )
    return _run(
        _transport(args),
        lambda transport, stop: bulk_query(
            args.input,
            args.output,
            transport,
            options,
            index=args.index,
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            chunk_rows=args.chunk_rows,
            int_ids=args.int_ids,
            restart=args.restart,
            overwrite=args.overwrite,
            show_progress=not args.no_progress,
            stop=stop,
        ),
    )


def _bulk_upsert(args: argparse.Namespace) -> int:
    return _run(
        _transport(args),
        lambda transport, stop: bulk_upsert(
            args.input,
            transport,
            index=args.index,
            progress_file=args.progress_file,
            batch_size=args.batch_size or constants.DEFAULT_BATCH,
            concurrency=args.concurrency,
            id_column=args.id_column,
            id_start=args.id_start,
            restart=args.restart,
            show_progress=not args.no_progress,
            stop=stop,
        ),
    )


def _run(transport: Any, start: Callable[[Any, Any], Awaitable[Report]]) -> int:
    """Run ``start(transport, stop)`` interruptibly, closing the transport at the end."""

    async def job(stop: Any) -> Report:
        try:
            return await start(transport, stop)
        finally:
            await transport.close()

    try:
        report = run_interruptible(job)
    except (ValueError, FileExistsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _finish(report)
