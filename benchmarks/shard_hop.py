"""The gateway -> shard hop: a search request and its result passed to a Ray actor as frozen
dataclasses (Ray's serializer) against the same objects pickled to bytes by hand, side by side;
the partition a call names, as the Partition dataclass against its encoded str; and a get's
answer for one id, as the Fetched dataclass against it pickled.

Run from the repository root: ``.venv/bin/python benchmarks/shard_hop.py``. Prints the p50 and
mean round trip of each form for a single query and for a batch of 1,000, and their ratios.
"""

from __future__ import annotations

import pickle
import statistics
import time
from typing import Any

import common  # noqa: F401  (puts the repository root on sys.path)
import numpy as np
import ray

from actors.engine.strings import StringBlock
from actors.types import Fetched, Partition, SearchRequest, SearchResult

ROUNDS = 7


@ray.remote(num_cpus=0.1)
class Echo:
    """Answers a fixed result of the request's shape, as a shard would, in either form."""

    def __init__(self, nq: int, k: int) -> None:
        rng = np.random.default_rng(0)
        ids = StringBlock.from_list([f"item-{i}" for i in range(nq * k)], (nq, k))
        meta = np.array([b'{"tag": 1}'] * (nq * k), dtype=object).reshape(nq, k)
        self.result = (
            SearchResult(rng.random((nq, k), dtype=np.float32), ids, meta, 1, nq * 8),
            nq * k,
        )

    def search(self, key: bytes, req: SearchRequest) -> tuple[SearchResult, int]:
        return self.result

    def search_bytes(self, key: bytes, req: bytes) -> bytes:
        pickle.loads(req)
        return pickle.dumps(self.result, protocol=5)

    def get(self, p: str, key: bytes, ids: list[str]) -> Fetched:
        return Fetched(ids, np.zeros((len(ids), 128), np.float32), [b'{"n":1}'], ["text"])

    def get_packed(self, p: str, key: bytes, ids: list[str]) -> bytes:
        return pickle.dumps(self.get(p, key, ids), protocol=5)

    def search_in(self, p: Partition | str, key: bytes, req: bytes) -> bytes:
        """As a pool actor's search_packed: the partition named first."""
        Partition.of(p)
        return self.search_bytes(key, req)


def request(nq: int, k: int, d: int = 128, nprobe: int = 8) -> SearchRequest:
    rng = np.random.default_rng(1)
    return SearchRequest(
        rng.random((nq, d), dtype=np.float32),
        k,
        1,
        rng.integers(0, 100, (nq, nprobe)),
        rng.random((nq, nprobe), dtype=np.float32),
    )


def timed(call: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def measure(nq: int, k: int, calls: int) -> tuple[list[float], list[float]]:
    actor = Echo.remote(nq, k)  # type: ignore[attr-defined]
    req, key = request(nq, k), b"k" * 32

    def as_objects() -> None:
        ray.get(actor.search.remote(key, req))

    def as_bytes() -> None:
        pickle.loads(ray.get(actor.search_bytes.remote(key, pickle.dumps(req, protocol=5))))

    objects: list[float] = []
    raw: list[float] = []
    for _ in range(ROUNDS):  # interleaved, so drift hits both alike
        objects += timed(as_objects, calls)
        raw += timed(as_bytes, calls)
    ray.kill(actor)
    return objects, raw


def measure_partition(calls: int) -> tuple[list[float], list[float]]:
    """A single query's call naming its partition as the dataclass, and as its encoded str."""
    actor = Echo.remote(1, 10)  # type: ignore[attr-defined]
    blob, key = pickle.dumps(request(1, 10), protocol=5), b"k" * 32
    partition = Partition("an-index", "0123456789abcdef", 0)
    dataclass, encoded = [], []
    for _ in range(ROUNDS):
        dataclass += timed(lambda: ray.get(actor.search_in.remote(partition, key, blob)), calls)
        encoded += timed(
            lambda: ray.get(actor.search_in.remote(partition.encode(), key, blob)), calls
        )
    ray.kill(actor)
    return dataclass, encoded


def measure_get(calls: int) -> tuple[list[float], list[float]]:
    """A get of one id with its vector, metadata and contents: the Fetched dataclass back, and
    the same pickled."""
    actor = Echo.remote(1, 10)  # type: ignore[attr-defined]
    p, key = Partition("an-index", "0123456789abcdef", 0).encode(), b"k" * 32
    dataclass, packed = [], []
    for _ in range(ROUNDS):
        dataclass += timed(lambda: ray.get(actor.get.remote(p, key, ["id-1"])), calls)
        packed += timed(
            lambda: pickle.loads(ray.get(actor.get_packed.remote(p, key, ["id-1"]))), calls
        )
    ray.kill(actor)
    return dataclass, packed


def rows(label: str, forms: list[tuple[str, list[float]]]) -> None:
    """One line per form: p50, mean, and p50 over the first form's p50."""
    base = statistics.median(forms[0][1])
    for form, xs in forms:
        p50 = statistics.median(xs)
        print(f"{label:<22}{form:<14}{p50:>9.3f}{statistics.fmean(xs):>9.3f}{p50 / base:>10.2f}x")


def header(first: str) -> None:
    print(f"{first:<22}{'form':<14}{'p50 ms':>9}{'mean ms':>9}{'ratio p50':>11}")


def main() -> None:
    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False)
    header("request")
    for label, nq, k, calls in (
        ("1 query, k=10", 1, 10, 300),
        ("1,000 queries, k=10", 1000, 10, 20),
    ):
        objects, raw = measure(nq, k, calls)
        rows(label, [("hand-pickled", raw), ("dataclasses", objects)])
    dataclass, encoded = measure_partition(300)
    print()
    header("1 query, partition")
    rows("", [("encoded str", encoded), ("dataclass", dataclass)])
    dataclass, packed = measure_get(300)
    print()
    header("get of 1 id, answer")
    rows("", [("hand-pickled", packed), ("dataclass", dataclass)])
    ray.shutdown()


if __name__ == "__main__":
    main()
