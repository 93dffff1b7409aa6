"""Online key rotation over HTTP (actors.control.rotation).

Under load: a writer and a reader go on while the index rotates its key several times; no
request fails but those made with a key whose rotation had started (401), and every
acknowledged item reads back under the last key. Through crashes: the whole real server (its
own Ray, as in test_durability) is SIGKILLed as soon as the store shows a rotation at a given
stage (recorded, partitions copying, switched), on the directory store and on PostgreSQL, and
restarted on the same store: exactly one of the two keys opens the index, with every
acknowledged item, and only that key's blobs remain.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from actors.storage import Store, open_store, persistence
from actors.types import IndexMeta
from cluster import fastpath
from cluster.client import Client, generate_key
from tests.helpers import free_port
from tests.integration.support import create_index, error, ok
from tests.pg_server import PostgresServer

pytestmark = pytest.mark.slow  # process kills

DIM = 16
API_KEY = "rotation-test-key"  # of the servers the kill tests start
RNG = np.random.default_rng(5)
X = RNG.normal(size=(60_000, DIM)).astype(np.float32)


def upsert_rows(c: httpx.Client, name: str, key: str, lo: int, hi: int) -> httpx.Response:
    body = {
        "index_name": name,
        "index_key": key,
        "ids": [f"r{j}" for j in range(lo, hi)],
        "vectors": base64.b64encode(X[lo:hi].tobytes()).decode(),
        "shape": [hi - lo, DIM],
        "contents": [f"c{j}" for j in range(lo, hi)],
    }
    return c.post("/v1/vectors/upsert_arrays", json=body)


def stored(c: httpx.Client, name: str, key: str, rows: set[int]) -> list[int]:
    """Of ``rows``, those whose item reads back with its vector and contents."""
    ids = [f"r{j}" for j in sorted(rows)]
    got = ok(c.post("/v1/vectors/get", json={"index_name": name, "index_key": key, "ids": ids}))
    found = []
    for item in got["results"]:
        j = int(item["id"][1:])
        if item["contents"] == f"c{j}" and np.array_equal(np.float32(item["vector"]), X[j]):
            found.append(j)
    return found


ROTATIONS = 5


def test_rotations_under_load_lose_no_write_and_refuse_only_rotated_keys(
    service: Any, http: httpx.Client
) -> None:
    """A writer and a reader go on while the index rotates its key ROTATIONS times; each uses
    the key of the last rotation that answered. Every request succeeds but those made with a
    key whose rotation had started (401), and every acknowledged write reads back."""
    api_key = http.headers["X-API-Key"]
    idx = create_index(http, dimension=DIM)
    for lo in range(0, 30_000, 1000):  # 30 WAL records: snapshots roll (wal_max_records 16)
        ok(upsert_rows(http, idx.name, idx.key, lo, lo + 1000))
    while idx.name in ok(http.get("/v1/indexes/training-status"))["training_indexes"]:
        time.sleep(0.1)  # the automatic training the upserts started
    idx.train(n_lists=16)  # on all the items: no retraining is due during the test
    keys = [idx.key] + [generate_key() for _ in range(ROTATIONS)]
    state = {"key": 0, "started": 0}  # keys[state["key"]] is in use; rotations started
    acked: set[int] = set(range(30_000))
    unsure: set[int] = set()
    answers: Counter[str] = Counter()
    stop = threading.Event()

    def load(writes: bool) -> None:
        with httpx.Client(base_url=service.url, headers={"X-API-Key": api_key}, timeout=60) as c:
            lo = 30_000
            while not stop.is_set():
                k = state["key"]
                answers["during a rotation"] += state["started"] > k
                if writes:
                    r = upsert_rows(c, idx.name, keys[k], lo, lo + 10)
                    if r.status_code == 200:
                        acked.update(range(lo, lo + 10))
                    else:  # refused by one partition, it may have been applied by another
                        unsure.update(range(lo, lo + 10))
                    lo += 10
                else:
                    query = {"index_name": idx.name, "index_key": keys[k], "top_k": 5}
                    r = c.post("/v1/vectors/query", json={**query, "query_vectors": X[lo].tolist()})
                    lo += 1
                if r.status_code == 200:
                    answers["ok"] += 1
                elif r.status_code == 401 and state["started"] > k:
                    answers["401 for a rotated key"] += 1
                else:
                    answers[f"error {r.status_code}"] += 1

    threads = [threading.Thread(target=load, args=(writes,)) for writes in (True, False)]
    for t in threads:
        t.start()
    took = []
    try:
        time.sleep(0.5)
        with Client(service.url, api_key) as vv:
            handle = vv.index(idx.name, keys[0])
            for i in range(1, ROTATIONS + 1):
                state["started"] = i
                started = time.monotonic()
                handle.rotate_key(keys[i])
                took.append(time.monotonic() - started)
                state["key"] = i
                assert handle.key == keys[i]
                time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    idx.key = keys[-1]
    lost = acked - set(stored(http, idx.name, idx.key, acked))
    errors = {k: n for k, n in answers.items() if k.startswith("error")}
    print(
        f"{ROTATIONS} rotations under load ({', '.join(f'{t:.2f}' for t in took)} s): "
        f"{answers['ok'] + answers['401 for a rotated key'] + sum(errors.values())} requests, "
        f"{answers['during a rotation']} sent during a rotation, "
        f"{answers['401 for a rotated key']} 401s for a rotated key, errors {errors}, "
        f"{len(acked)} items acknowledged, {len(lost)} lost"
    )
    assert errors == {} and lost == set()
    assert answers["during a rotation"] > 0
    for old in keys[:-1]:
        for route, extra in (
            ("vectors/query", {"query_vectors": X[0].tolist()}),
            ("vectors/get", {"ids": ["r1"]}),
            ("indexes/describe", {}),
        ):
            error(http.post(f"/v1/{route}", json={**idx.body(), "index_key": old, **extra}), 401)
    assert len(acked) <= idx.count() <= len(acked | unsure)
    idx.drop()


# -- SIGKILL of the whole server mid-rotation ------------------------------------------------
def serve(storage: str, ray_tmp: str, port: int) -> subprocess.Popen[str]:
    env = dict(fastpath.without_ports(dict(os.environ)), RAY_TMPDIR=ray_tmp)
    env["VAULTVEC_API_KEY"] = API_KEY
    env["VAULTVEC_WAL_MAX_RECORDS"] = "8"
    env["VAULTVEC_AUTO_TRAIN_THRESHOLD"] = "1000000"  # a training would refuse rotations
    env.pop("RAY_ADDRESS", None)
    args = ["serve", "--storage", storage, "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    said = []
    for line in proc.stdout:
        said.append(line)
        if "vaultvec serving at" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep it drained
            return proc
        if time.monotonic() > deadline:
            break
    kill_service(proc, ray_tmp, [])
    raise AssertionError("server did not start:\n" + "".join(said[-30:]))


def service_pids(ray_tmp: str) -> list[int]:
    """Every process of the server started with ``ray_tmp`` (the CLI, Ray's daemons and
    workers: all carry the path in their command line or environment)."""
    mark, pids = ray_tmp.encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with (
                open(f"/proc/{entry}/cmdline", "rb") as f,
                open(f"/proc/{entry}/environ", "rb") as e,
            ):
                if mark in f.read() or mark in e.read():
                    pids.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def kill_service(proc: subprocess.Popen[str], ray_tmp: str, pids: list[int]) -> None:
    """SIGKILL the whole server at once: ``pids`` (listed beforehand, so the kill is not
    slowed by looking them up), then whatever of it is left."""
    for _ in range(100):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pids = service_pids(ray_tmp)
        if not pids:
            break
        time.sleep(0.05)
    proc.wait(timeout=30)


def settle(c: httpx.Client, name: str, keys: tuple[str, str]) -> list[int]:
    """The status each key gets once the restarted server settled the rotation (a 503 is a
    rotation still being settled: asked again)."""
    deadline = time.monotonic() + 90
    while True:
        codes = [
            c.post("/v1/vectors/num_vectors", json={"index_name": name, "index_key": k}).status_code
            for k in keys
        ]
        if 503 not in codes or time.monotonic() > deadline:
            return codes
        time.sleep(0.2)


# Where a rotation is when the test kills the service: observed in the store (the meta entry
# and the next key epoch's blobs), then SIGKILL at once.
STAGES: dict[str, Callable[[Store, IndexMeta], bool]] = {
    # the entry records the rotation: partitions are about to copy their state
    "recorded": lambda store, meta: _meta(store, meta).rotation is not None,
    # a partition's snapshot under the new key is written: it writes under both keys
    "copying": lambda store, meta: any(
        "/snap/" in k for k in store.list(persistence.epoch_prefix(meta.index_id, meta.epoch + 1))
    ),
    # the entry names the new epoch: the old key's blobs are being deleted
    "switched": lambda store, meta: _meta(store, meta).epoch > meta.epoch,
}


def _meta(store: Store, meta: IndexMeta) -> IndexMeta:
    current = persistence.load_meta(store, meta.index_id)
    assert current is not None
    return current


class Rotations:
    """One server process on ``storage`` holding an index under writes, rotated again and
    again; ``acked`` holds the rows whose upsert was answered 200."""

    def __init__(self, storage: str) -> None:
        self.storage = storage
        self.ray_tmp, self.port = tempfile.mkdtemp(prefix="vr", dir="/tmp"), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name, self.key = "rotating", generate_key()
        self.acked: set[int] = set()
        self.next_row = 0
        self.rotated: list[Any] = []  # the answer of the rotation under way
        try:
            self.proc = serve(storage, self.ray_tmp, self.port)
        except BaseException:
            shutil.rmtree(self.ray_tmp, ignore_errors=True)
            raise
        self.store = open_store(storage)  # to watch the rotation's progress

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": API_KEY}, timeout=120)

    def fill(self, n: int) -> None:
        with self.client() as c:
            body = {"index_name": self.name, "index_key": self.key}
            ok(c.post("/v1/indexes/create", json={**body, "index_config": {"dimension": DIM}}))
            for lo in range(0, n, 1000):
                ok(upsert_rows(c, self.name, self.key, lo, lo + 1000))
            train = {**body, "n_lists": 16}
            assert ok(c.post("/v1/indexes/train", json=train))["status"] == "success"
        self.acked.update(range(n))
        self.next_row = n

    def meta(self) -> IndexMeta:
        (key,) = [k for k in self.store.list("indexes/") if k.endswith("/meta")]
        meta = persistence.load_meta(self.store, key.split("/")[1])
        assert meta is not None
        return meta

    def write(self, key: str) -> None:
        """Upserts of 100 rows under ``key`` until the rotation answers or the server dies."""
        with self.client() as c:
            while not self.rotated and self.next_row + 100 <= len(X):
                lo = self.next_row
                self.next_row += 100
                try:
                    r = upsert_rows(c, self.name, key, lo, lo + 100)
                except httpx.HTTPError:
                    return  # the server died mid-request: not acknowledged
                if r.status_code == 200:
                    self.acked.update(range(lo, lo + 100))

    def rotate(self, new: str) -> None:
        body = {"index_name": self.name, "index_key": self.key, "new_index_key": new}
        with self.client() as c:
            try:
                self.rotated.append(c.post("/v1/indexes/rotate_key", json=body).status_code)
            except httpx.HTTPError:
                self.rotated.append("killed")

    def round(self, stage: str | None) -> str:
        """A rotation under writes; SIGKILL the whole service as soon as the store shows it
        reached ``stage`` (None: let it finish), restart. Exactly one key opens the index then,
        holding every acknowledged row; returns the stage, the rotation's answer and the key
        that opens the index."""
        new, before = generate_key(), self.meta()
        self.rotated = []
        writer = threading.Thread(target=self.write, args=(self.key,))
        writer.start()
        time.sleep(0.3)  # writes under way first
        pids = service_pids(self.ray_tmp)
        rotator = threading.Thread(target=self.rotate, args=(new,))
        rotator.start()
        if stage is None:
            rotator.join()
            assert self.rotated == [200]
        else:
            reached = STAGES[stage]
            deadline = time.monotonic() + 60
            while not reached(self.store, before) and time.monotonic() < deadline:
                time.sleep(0.001)
            kill_service(self.proc, self.ray_tmp, pids)
            self.proc = serve(self.storage, self.ray_tmp, self.port)
        rotator.join(timeout=120)
        writer.join(timeout=120)
        old = self.key
        with self.client() as c:
            codes = settle(c, self.name, (old, new))
            assert sorted(codes) == [200, 401], (stage, self.rotated, codes)
            self.key = old if codes[0] == 200 else new
            if self.rotated == [200] or stage == "switched":
                assert self.key == new  # a rotation that switched stays switched
            lost = self.acked - set(stored(c, self.name, self.key, self.acked))
            assert lost == set(), f"{len(lost)} acknowledged rows lost"
            ok(upsert_rows(c, self.name, self.key, 0, 10))  # and it takes writes again
        meta = self.meta()
        assert meta.rotation is None and meta.retired_epoch == -1  # settled
        assert set(persistence.stored_epochs(self.store, meta.index_id)) == {meta.epoch}
        return f"{stage or 'not killed'}: {self.rotated[0]}, {'new' if self.key == new else 'old'}"

    def close(self) -> None:
        kill_service(self.proc, self.ray_tmp, service_pids(self.ray_tmp))
        self.store.close()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def kill_mid_rotation(storage: str, stages: list[str]) -> list[str]:
    """A whole rotation, then one SIGKILLed at each of ``stages`` (of STAGES)."""
    rotations = Rotations(storage)
    try:
        rotations.fill(6_000)
        return [rotations.round(stage) for stage in [None, *stages]]
    finally:
        rotations.close()


def test_sigkill_mid_rotation_on_the_directory_store(tmp_path: Path) -> None:
    outcomes = kill_mid_rotation(f"file://{tmp_path / 'store'}", list(STAGES))
    print("directory store, kills:", outcomes)


def test_sigkill_mid_rotation_on_postgresql(postgres_server: PostgresServer) -> None:
    outcomes = kill_mid_rotation(postgres_server.create_database(), ["copying", "switched"])
    print("PostgreSQL store, kills:", outcomes)
