"""BM25 full-text search over the metadata fields an index marks ``full_text``.

The analyser (:func:`analyse`) is shared by the shards, which index documents, and the gateway,
which analyses the query once: Unicode word tokens, case-folded, English stop words dropped,
Snowball's English stemmer. A shard builds a field's postings from the decrypted metadata it
already holds, the first time a query searches that field, and keeps them up to date with every
write; they live only in memory and are never written anywhere (the metadata they are made from
is sealed in the store like everything else), so the store never sees a term.

Scores are Lucene's BM25 with per-field collection statistics::

    idf(t)    = ln(1 + (N - df + 0.5) / (df + 0.5))
    score(d)  = sum over fields f of  w_f * sum over distinct query terms t in d of
                idf_f(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len_f(d) / avglen_f))

where N is the number of live items with at least one term in field f. On a sharded index the
gateway sums each shard's statistics first (:class:`actors.types.TextStats`) so every shard
scores with the index-wide N, df and average length: sharded scores equal unsharded ones.
"""

from __future__ import annotations

import math
import re
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import orjson
import snowballstemmer

from actors.types import TextStats

ANALYZER_VERSION = "vaultvec-en-1"

# Lucene's English stop words (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET).
STOP_WORDS = frozenset(
    {
        *("a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into"),
        *("is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then"),
        *("there", "these", "they", "this", "to", "was", "will", "with"),
    }
)
_WORD = re.compile(r"\w+")
_stemmer = snowballstemmer.stemmer("english")
_stem_lock = threading.Lock()  # the stemmer object keeps state between calls
_stems: dict[str, str] = {}  # word -> stem; a plain dict: looked up once per word of every text
MAX_STEMS = 1 << 18  # bounded: emptied when full (a hostile text cannot grow it without end)


def _stem(word: str) -> str:
    with _stem_lock:
        stem = str(_stemmer.stemWord(word))
        if len(_stems) >= MAX_STEMS:
            _stems.clear()
        _stems[word] = stem
        return stem


def analyse(text: str) -> list[str]:
    """The terms of ``text``, in order (a term repeats as often as it occurs)."""
    get = _stems.get
    return [get(w) or _stem(w) for w in _WORD.findall(text.casefold()) if w not in STOP_WORDS]


def query_terms(text: str) -> tuple[str, ...]:
    """A query's distinct terms, in first-occurrence order (a repeated word counts once)."""
    return tuple(dict.fromkeys(analyse(text)))


def field_text(metadata: Any, path: str) -> str | None:
    """The text at dot ``path`` of one item's metadata: a string, or the strings of a list
    joined; None when the item has none there."""
    value = metadata
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        strings = [v for v in value if isinstance(v, str)]
        return " ".join(strings) if strings else None
    return None


class FieldIndex:
    """One field's postings: per term the labels holding it and how often; per label its
    length in terms (0: no text, replaced or deleted). Labels are never reused, so a posting
    of a dead label is skipped by its length until compaction relabels the table."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.labels: list[array[int]] = []
        self.tfs: list[array[int]] = []
        self.lengths = np.zeros(0, dtype=np.int64)
        self.docs = 0
        self.total = 0

    def add(self, labels: Sequence[int], texts: Iterable[str | None]) -> None:
        top = max(labels, default=-1) + 1
        if top > len(self.lengths):
            grown = np.zeros(max(top, 2 * len(self.lengths), 1024), dtype=np.int64)
            grown[: len(self.lengths)] = self.lengths
            self.lengths = grown
        flat: list[str] = []  # every term of every text, text after text
        owners: list[int] = []
        counts: list[int] = []
        for label, text in zip(labels, texts, strict=True):
            terms = analyse(text) if text else []
            if terms:
                flat.extend(terms)
                owners.append(label)
                counts.append(len(terms))
        if not flat:
            return
        vocab = self.vocab
        tids = np.fromiter(
            (vocab.setdefault(t, len(vocab)) for t in flat), dtype=np.int64, count=len(flat)
        )
        for _ in range(len(vocab) - len(self.labels)):  # terms seen for the first time
            self.labels.append(array("q"))
            self.tfs.append(array("q"))
        doc = np.repeat(np.asarray(owners, dtype=np.int64), counts)
        # (term, label) pairs with their counts, ordered by term then label
        pairs, tf = np.unique(tids * top + doc, return_counts=True)
        term, label = np.divmod(pairs, top)
        starts = np.flatnonzero(np.r_[True, term[1:] != term[:-1]])
        ends = np.r_[starts[1:], len(term)]
        for t, a, b in zip(term[starts].tolist(), starts.tolist(), ends.tolist(), strict=True):
            self.labels[t].frombytes(label[a:b].tobytes())
            self.tfs[t].frombytes(tf[a:b].astype(np.int64).tobytes())
        self.lengths[owners] = counts
        self.docs += len(owners)
        self.total += len(flat)

    def remove(self, labels: np.ndarray) -> None:
        labels = labels[labels < len(self.lengths)]
        lengths = self.lengths[labels]
        self.docs -= int(np.count_nonzero(lengths))
        self.total -= int(lengths.sum())
        self.lengths[labels] = 0

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(labels, term frequencies) of the live items holding ``term``."""
        tid = self.vocab.get(term)
        if tid is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        labels = np.frombuffer(self.labels[tid], dtype=np.int64)
        tfs = np.frombuffer(self.tfs[tid], dtype=np.int64)
        live = self.lengths[labels] > 0
        return labels[live], tfs[live]

    def stats(self, terms: Sequence[str]) -> TextStats:
        df = tuple(len(self.postings(t)[0]) for t in terms)
        return TextStats(self.docs, self.total, df)

    def relabelled(self, new_of: np.ndarray) -> FieldIndex:
        """The same postings under compaction's labels (``new_of``: -1 for dead rows)."""
        out = FieldIndex()
        n = int(new_of.max()) + 1 if len(new_of) else 0
        out.lengths = np.zeros(max(n, 1024), dtype=np.int64)
        old = np.flatnonzero(new_of >= 0)
        old = old[old < len(self.lengths)]
        out.lengths[new_of[old]] = self.lengths[old]
        out.docs, out.total = self.docs, self.total
        for term in self.vocab:
            labels, tfs = self.postings(term)
            moved = new_of[labels]
            keep = moved >= 0
            if not keep.any():
                continue
            out.vocab[term] = len(out.labels)
            out.labels.append(array("q", moved[keep].tobytes()))
            out.tfs.append(array("q", tfs[keep].tobytes()))
        return out

    def nbytes(self) -> int:
        postings = sum(a.itemsize * len(a) for a in self.labels) * 2
        return int(self.lengths.nbytes) + postings + 64 * len(self.vocab)


class TextIndex:
    """The full-text fields of one item table, built on first use (:meth:`field`)."""

    def __init__(self) -> None:
        self.fields: dict[str, FieldIndex] = {}
        self._building = threading.Lock()  # queries share the shard's read lock

    def field(self, path: str, metadata: np.ndarray, alive: np.ndarray) -> FieldIndex:
        """The postings of ``path``, built from the table's metadata the first time."""
        built = self.fields.get(path)
        if built is not None:
            return built
        with self._building:
            built = self.fields.get(path)
            if built is None:
                built = FieldIndex()
                labels = np.flatnonzero(alive).tolist()
                texts = (
                    None if metadata[i] is None else field_text(orjson.loads(metadata[i]), path)
                    for i in labels
                )
                built.add(labels, texts)
                self.fields[path] = built
            return built

    def add(self, labels: Sequence[int], parsed: Sequence[Any]) -> None:
        """New items (metadata already parsed) into every field built so far."""
        for path, index in self.fields.items():
            index.add(labels, (field_text(m, path) for m in parsed))

    def remove(self, labels: np.ndarray) -> None:
        for index in self.fields.values():
            index.remove(labels)

    def relabelled(self, new_of: np.ndarray) -> TextIndex:
        out = TextIndex()
        out.fields = {path: index.relabelled(new_of) for path, index in list(self.fields.items())}
        return out

    def nbytes(self) -> int:
        return sum(index.nbytes() for index in self.fields.values())


def score(
    indexes: Sequence[FieldIndex],
    weights: Sequence[float],
    terms: Sequence[str],
    stats: Sequence[TextStats],
    k1: float,
    b: float,
    require_all: bool,
    allowed: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(labels, BM25 scores) of the items matching at least one term (every term with
    ``require_all``) in the searched fields, among ``allowed`` (a boolean mask by label, or
    None for every live item); unordered. ``stats`` are each field's collection statistics
    (index-wide on a sharded index)."""
    labels_parts: list[np.ndarray] = []
    score_parts: list[np.ndarray] = []
    term_parts: list[np.ndarray] = []
    for index, weight, st in zip(indexes, weights, stats, strict=True):
        if st.docs == 0 or weight == 0:
            continue
        avg = st.length / st.docs
        for t, (term, df) in enumerate(zip(terms, st.df, strict=True)):
            if df == 0:
                continue
            labels, tf = index.postings(term)
            if allowed is not None:
                keep = allowed[labels]
                labels, tf = labels[keep], tf[keep]
            if not len(labels):
                continue
            idf = math.log(1.0 + (st.docs - df + 0.5) / (df + 0.5))
            tf = tf.astype(np.float64)
            norm = k1 * (1.0 - b + b * index.lengths[labels] / avg)
            labels_parts.append(labels)
            score_parts.append(weight * idf * tf * (k1 + 1.0) / (tf + norm))
            term_parts.append(np.full(len(labels), t, dtype=np.int64))
    if not labels_parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    all_labels = np.concatenate(labels_parts)
    found, inverse = np.unique(all_labels, return_inverse=True)
    scores = np.bincount(inverse, weights=np.concatenate(score_parts), minlength=len(found))
    if require_all and len(terms) > 1:
        pairs = np.unique(inverse * len(terms) + np.concatenate(term_parts))
        matched = np.bincount(pairs // len(terms), minlength=len(found))
        keep = matched == len(terms)
        found, scores = found[keep], scores[keep]
    return found, scores


def top(
    scores: np.ndarray, k: int | None, ids_of: Callable[[np.ndarray], list[str]]
) -> tuple[np.ndarray, list[str]]:
    """(positions, ids) of the best ``k`` (all when None) by descending score, ties by id;
    ``ids_of`` gives the ids of positions. Only the candidates scoring at least the k-th best
    are sorted."""
    n = len(scores)
    if k is None or n <= k:
        cand = np.arange(n, dtype=np.int64)
    else:
        cand = np.flatnonzero(scores >= np.partition(scores, n - k)[n - k])
    ids = ids_of(cand)
    order = sorted(range(len(cand)), key=lambda i: (-scores[cand[i]], ids[i]))[:k]
    return cand[order], [ids[i] for i in order]
