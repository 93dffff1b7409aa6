"""``vaultvec backup`` and ``vaultvec restore``: one index's encrypted backup to a file, and
back into a server (the same or another, any store) under its name or a new one.

The file holds what the server streams (actors.storage.backup_format): ciphertext, and a
plaintext header with what the store's catalog keeps in the clear. It is written as
``<file>.partial`` (0600) and renamed once the server's end frame arrived, so a file under its
name is a complete backup. A restore sends it back a chunk at a time; the index key opens it.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from typing import IO, Any

import orjson

from actors.storage.backup_format import (
    CHUNK,
    CHUNK_HEAD,
    CONFIG,
    END,
    ERROR,
    HEADER,
    TEMPLATE,
    BadBackup,
    read_frames,
)
from cluster.client import Client
from cluster.client.calls import Call
from cluster.client.errors import error_for


class BackupFailed(RuntimeError):
    """The server cut the backup short (its error frame's detail)."""


class _Tee:
    """Reads a response's bytes and writes them to ``out`` as they are read."""

    def __init__(self, chunks: Any, out: IO[bytes], bar: Any) -> None:
        self.chunks, self.out, self.bar = chunks, out, bar
        self.buf = bytearray()

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            piece = next(self.chunks, b"")
            if not piece:
                break
            self.out.write(piece)
            self.bar.update(len(piece))
            self.buf += piece
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


def backup(
    client: Client,
    index: str,
    key: str,
    out: Path,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Stream ``index``'s backup into ``out``; returns its header and chunks per shard."""
    from tqdm import tqdm

    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    body = {"index_name": index, "index_key": key}
    try:
        with (
            os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f,
            client.http.stream("POST", "/v1/indexes/backup", json=body) as r,
            tqdm(unit="B", unit_scale=True, disable=not progress, file=sys.stderr) as bar,
        ):
            if r.status_code != 200:
                r.read()
                answer = orjson.loads(r.content) if r.content.startswith(b"{") else {}
                raise error_for(r.status_code, str(answer.get("detail", r.text[:300])), None)
            header: dict[str, Any] = {}
            for kind, payload in read_frames(_Tee(r.iter_bytes(1 << 20), f, bar)):
                if kind == HEADER:
                    header = orjson.loads(payload)
                elif kind == ERROR:
                    raise BackupFailed(orjson.loads(payload)["detail"])
                elif kind == END:
                    chunks = orjson.loads(payload)["chunks"]
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, out)
    return {"header": header, "chunks": chunks}


def restore(
    client: Client, source: Path, key: str, *, name: str | None = None, progress: bool = True
) -> int:
    """Restore the backup in ``source`` into a new index ``name`` (default: the backed-up
    index's name); returns the items restored."""
    from tqdm import tqdm

    target: dict[str, Any] = {}
    counts: list[int] = []
    config = template = None
    with (
        source.open("rb") as f,
        tqdm(
            total=source.stat().st_size,
            unit="B",
            unit_scale=True,
            disable=not progress,
            file=sys.stderr,
        ) as bar,
    ):
        for kind, payload in read_frames(f):
            bar.update(1 + 8 + len(payload))
            if kind == HEADER:
                header = orjson.loads(payload)
                target = {
                    "index_name": name or header["index_name"],
                    "index_key": key,
                    "backup": header,
                }
                counts = [0] * int(header["n_shards"])
            elif kind == CONFIG:
                config = base64.b64encode(payload).decode("ascii")
            elif kind == TEMPLATE:
                template = base64.b64encode(payload).decode("ascii")
            elif kind == CHUNK:
                if config is not None:  # the first chunk: create the index
                    begin = {**target, "config": config, "template": template}
                    client.call(Call("/v1/indexes/restore/begin", begin))
                    config = None
                shard, n, total = CHUNK_HEAD.unpack_from(payload)
                chunk = base64.b64encode(payload[CHUNK_HEAD.size :]).decode("ascii")
                part = {**target, "shard": shard, "n": n, "total": total, "chunk": chunk}
                installed = client.call(Call("/v1/indexes/restore/chunk", part))["installed"]
                if installed is not None:
                    counts[shard] = installed
            elif kind == ERROR:
                raise BadBackup(f"the backup was cut short: {orjson.loads(payload)['detail']}")
    if not target or config is not None:
        raise BadBackup("the backup holds no shard data")
    answer = client.call(Call("/v1/indexes/restore/commit", {**target, "counts": counts}))
    return int(answer["num_vectors"])
