"""Online key rotation: every stored blob of an index re-sealed under a new key while queries and
writes go on, safe against a crash at any point.

Each key an index has had is a *key epoch* (IndexMeta.epoch). An epoch's blobs — config,
templates, every partition's snapshots and WAL — live under their own prefix
(actors.storage.persistence.epoch_prefix), sealed with that epoch's data key. The catalog entry
(IndexMeta: plaintext, written by one atomic put) names the current epoch with its salt and
verifier; that put is the switch. A rotation from epoch e to n = e + 1:

1. **Intent.** Blobs of any epoch but e (an aborted attempt's) are deleted, then the entry
   records the rotation (``rotation``: n's salt and verifier). From now on a partition that
   loads while its snapshot under n exists (it was prepared, then restarted) refuses writes
   (:meth:`actors.engine.shard_keys.ShardKeys.gate_write`): it no longer writes under both keys, and a write only e had
   would be missing from n after the switch.
2. **Partitions** (``begin_rotation``, on every partition at once). Under its write lock for the
   time of a capture, a partition takes a snapshot of its whole state and starts a new WAL
   generation; the snapshot is sealed under the new key into n, and from then on each WAL
   record is appended under the new key into n, then under the old one into e, before the
   write is acknowledged. Reads and writes go on throughout; snapshot rolls write both epochs.
3. **Config and templates** are re-sealed into n (under the control plane's lock, which also
   orders them with a first upsert fixing the dimension).
4. **Switch.** One put of the entry: epoch n, its salt and verifier, ``retired_epoch`` e.
5. **Commit** (``commit_rotation``): each partition drops the old key and writes under n only.
6. **Cleanup.** Epoch e's blobs are deleted, then ``retired_epoch`` is cleared.

Before step 4 completes, e holds every acknowledged write (the old key's view of the store is
never touched but by appends), so a failure aborts: partitions stop writing under the new key,
the entry drops ``rotation``, n is deleted. After it, n holds every acknowledged write: its
snapshots were taken under the write lock and every later record went to n before it was
acknowledged (a partition that lost its place in the rotation refuses writes instead). A control
plane that starts and finds ``rotation`` in an entry aborts; one that finds ``retired_epoch``
finishes steps 5–6 (:func:`recover`); both need no key. So whatever was killed when, exactly one
key opens the index and every acknowledged write is in its epoch.

Keys: a gateway verifies the current verifier only; a key matching the rotation's verifier is
told to retry (503) until the switch. The old key is refused (401) from the switch on by the
gateways that see the new entry and by the control plane (which checks a data key against the
current epoch's config blob), and by each partition once it commits, before the rotation
answers. Training and rotation of one index exclude each other (:class:`Busy`, 409).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError

from actors.errors import IndexNotFound, IndexRetired, Unavailable, VaultvecError
from actors.pool.client import ShardClient
from actors.storage import Store, persistence
from actors.types import IndexMeta, KeyRotation

log = logging.getLogger("vaultvec.rotation")


# The Python client tells this 409 from a taken name by these words (cluster.client.errors).
BUSY = "is training or rotating its key, or moving a partition; retry when it is done"


class Busy(VaultvecError):
    """The index is training, rotating its key or moving a partition: the request conflicts with
    that; retry."""

    status_code = 409
    default_detail = f"the index {BUSY}"


class Unsettled(Unavailable):
    """The switch was written but could not be confirmed: the index stays locked against
    another rotation or training until the control plane restarts and reads the store."""

    default_detail = (
        "the key switch could not be confirmed in the store; the control plane settles it when "
        "it restarts"
    )


class Partitions(Protocol):
    """Every partition of one index, called at once."""

    def begin(self, key: bytes, new_key: bytes, epoch: int) -> None: ...

    def commit(self, epoch: int) -> None: ...

    def abort(self, epoch: int) -> None: ...


class Catalog(Protocol):
    """What a rotation needs of the control plane (actors.control.plane.ControlPlane)."""

    store: Store

    def update_meta(self, meta: IndexMeta, change: Callable[[IndexMeta], IndexMeta]) -> IndexMeta:
        """Under the catalog's lock: persist and cache ``change`` of the index's current entry
        (IndexNotFound if the index was deleted or re-created)."""
        ...

    def switch_key(
        self, meta: IndexMeta, key: bytes, rotation: KeyRotation, new_key: bytes
    ) -> IndexMeta:
        """Steps 3-4: config and templates re-sealed into the next epoch, then the switch."""
        ...


def rotate(
    catalog: Catalog,
    parts: Partitions,
    meta: IndexMeta,
    key: bytes,
    rotation: KeyRotation,
    new_key: bytes,
) -> IndexMeta:
    """Rotate the index of ``meta`` from data key ``key`` to ``new_key`` (whose salt and
    verifier ``rotation`` holds); returns the switched entry."""
    if meta.retired_epoch >= 0:  # an earlier rotation's cleanup was cut short
        meta = finish(catalog, parts, meta)
    epoch = meta.epoch + 1
    for stale in persistence.stored_epochs(catalog.store, meta.index_id).keys() - {meta.epoch}:
        persistence.delete_epoch(catalog.store, meta.index_id, stale)  # an aborted attempt's
    meta = catalog.update_meta(meta, lambda m: replace(m, rotation=rotation))
    try:
        parts.begin(key, new_key, epoch)
        switched = catalog.switch_key(meta, key, rotation, new_key)
    except Unsettled:
        raise  # both epochs stay complete: partitions keep writing under both keys
    except Exception:
        abort(catalog, parts, meta)
        raise
    return finish(catalog, parts, switched)


def finish(catalog: Catalog, parts: Partitions, meta: IndexMeta) -> IndexMeta:
    """Steps 5-6 after the switch: partitions commit, the retired epoch is deleted."""
    parts.commit(meta.epoch)
    persistence.delete_epoch(catalog.store, meta.index_id, meta.retired_epoch)
    return catalog.update_meta(meta, lambda m: replace(m, retired_epoch=-1))


def abort(catalog: Catalog, parts: Partitions, meta: IndexMeta) -> None:
    """Undo a rotation that did not switch: partitions stop writing under the new key, the
    entry forgets the rotation, the new epoch is deleted (in that order: a crash in between
    leaves an entry that still says so, and the next start aborts again)."""
    epoch = meta.epoch + 1
    parts.abort(epoch)
    try:
        catalog.update_meta(meta, lambda m: replace(m, rotation=None))
    except IndexNotFound:
        return  # deleted meanwhile: its whole prefix is gone or going
    persistence.delete_epoch(catalog.store, meta.index_id, epoch)


def recover(catalog: Catalog, parts: Partitions, meta: IndexMeta) -> None:
    """Settle a rotation a stopped control plane left behind (no key needed): abort one that
    had not switched, finish one that had."""
    if meta.rotation is not None:
        log.warning("aborting the interrupted key rotation of index id %s", meta.index_id)
        abort(catalog, parts, meta)
    elif meta.retired_epoch >= 0:
        log.warning("finishing the interrupted key rotation of index id %s", meta.index_id)
        finish(catalog, parts, meta)


def landed(store: Store, meta: IndexMeta) -> bool:
    """After a failed switch put: whether it landed anyway (the store holds ``meta``'s epoch);
    Unsettled when the store cannot tell."""
    try:
        stored = persistence.load_meta(store, meta.index_id)
    except Exception:
        raise Unsettled() from None
    return stored is not None and stored.epoch == meta.epoch


class RayPartitions:
    """:class:`Partitions` over the pool actors hosting an index's partitions."""

    def __init__(self, clients: Sequence[ShardClient]) -> None:
        self.clients = list(clients)

    def begin(self, key: bytes, new_key: bytes, epoch: int) -> None:
        refs = [c.begin_rotation(key, new_key, epoch) for c in self.clients]
        # Every partition answers before one failure is raised: an abort sent meanwhile could
        # run before a begin still under way and leave that partition writing under both keys.
        ray.wait(refs, num_returns=len(refs))
        ray.get(refs)

    def commit(self, epoch: int) -> None:
        self._each(lambda c: c.commit_rotation(epoch))

    def abort(self, epoch: int) -> None:
        self._each(lambda c: c.abort_rotation(epoch))

    def _each(self, call: Callable[[ShardClient], Any]) -> None:
        """``call`` on every partition, waiting for each answer (no timeout: a partition that
        did not hear it would go on with the old key). A pool actor that died holds nothing of
        the rotation when it restarts; a retired partition holds nothing at all."""
        failed: BaseException | None = None
        for ref in [call(c) for c in self.clients]:
            try:
                ray.get(ref)
            except (RayActorError, IndexRetired):
                pass
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def recover_in_background(
    catalog: Catalog,
    metas: Sequence[IndexMeta],
    partitions: Callable[[IndexMeta], Partitions],
    settled: Callable[[str], None],
) -> threading.Thread | None:
    """Settle, in a thread, the rotations of ``metas`` a stopped control plane left behind
    (:func:`recover`), calling ``settled(name)`` after each; those indexes refuse rotation and
    training until then."""
    if not metas:
        return None

    def run() -> None:
        for meta in metas:
            try:
                recover(catalog, partitions(meta), meta)
            except Exception:  # stays marked in the store: the next start tries again
                log.exception("could not settle the key rotation of index id %s", meta.index_id)
            finally:
                settled(meta.name)

    thread = threading.Thread(target=run, name="vaultvec-rotation-recovery", daemon=True)
    thread.start()
    return thread
