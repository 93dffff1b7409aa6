"""The side of ``test_migrate.py`` that runs in the ``cyborgdb-migrate`` environment
(``support.migrate_python()``, run with ``python -I``), never in the project's.

``build SOURCE_DIR PATH NAME``: a local persistent ChromaDB collection ``NAME`` at ``PATH`` from
``SOURCE_DIR/vectors.npy`` and ``SOURCE_DIR/items.json`` (ids, metadatas, documents; ``None``
for none). It has no embedding function and is given every embedding, so ChromaDB never fetches
its default model. What the collection then holds, read back in ``items.json``'s order, goes to
``SOURCE_DIR/held.npy`` and ``SOURCE_DIR/held.json``: ChromaDB does not keep every float
metadata value to the last bit.

``run [--hold-after N --marker FILE] -- ARGS``: ``cyborgdb-migrate ARGS``, as its console script
runs it. With ``--hold-after``, the tool's ``N + 1``-th batch upsert writes ``FILE`` and blocks for
good instead of being sent (its upserts run one at a time, on one worker thread): the server
holds exactly the first ``N`` batches when ``FILE`` appears, and the test kills the process there.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any


def build(source_dir: Path, path: Path, name: str) -> None:
    import chromadb
    import numpy as np

    vectors = np.load(source_dir / "vectors.npy")
    items = json.loads((source_dir / "items.json").read_text())
    client = chromadb.PersistentClient(path=str(path))
    collection = client.create_collection(
        name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
    )
    step = 500
    for start in range(0, len(vectors), step):
        end = start + step
        collection.add(
            ids=items["ids"][start:end],
            embeddings=vectors[start:end],
            metadatas=items["metadatas"][start:end],
            documents=items["documents"][start:end],
        )
    held = collection.get(ids=items["ids"], include=["embeddings", "metadatas", "documents"])
    order = {item_id: i for i, item_id in enumerate(held["ids"])}
    rows = [order[item_id] for item_id in items["ids"]]
    np.save(source_dir / "held.npy", np.asarray(held["embeddings"], dtype=np.float32)[rows])
    (source_dir / "held.json").write_text(
        json.dumps(
            {
                "ids": items["ids"],
                "metadatas": [held["metadatas"][r] for r in rows],
                "documents": [held["documents"][r] for r in rows],
            }
        )
    )
    print(json.dumps({"count": collection.count()}))


def hold_upserts(after: int, marker: Path) -> None:
    from cyborgdb_migrate.destination import CyborgDestination

    send = CyborgDestination.upsert_batch
    calls = 0

    def upsert_batch(self: Any, records: list[Any]) -> int:
        nonlocal calls
        calls += 1
        if calls > after:
            marker.write_text(json.dumps({"batches_sent": after}))
            threading.Event().wait()  # until the test kills the process
        result: int = send(self, records)
        return result

    CyborgDestination.upsert_batch = upsert_batch


def run(args: list[str], hold_after: int | None, marker: Path | None) -> None:
    from cyborgdb_migrate.cli import main

    if hold_after is not None:
        assert marker is not None, "--hold-after needs --marker"
        hold_upserts(hold_after, marker)
    sys.argv = ["cyborgdb-migrate", *args]
    main()


def cli() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("source_dir", type=Path)
    b.add_argument("path", type=Path)
    b.add_argument("name")
    r = sub.add_parser("run")
    r.add_argument("--hold-after", type=int)
    r.add_argument("--marker", type=Path)
    r.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    if ns.command == "build":
        build(ns.source_dir, ns.path, ns.name)
    else:
        args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
        run(args, ns.hold_after, ns.marker)


if __name__ == "__main__":
    cli()
