"""CyborgDB's ``metadata_schema``: per metadata field, whether it is ``filterable``, whether it
takes ``pattern`` operators (``$regex``, ``$contains``) and whether it is ``full_text`` (its text
searched by BM25: actors.engine.fulltext). Fields the schema does not name are filterable. As
CyborgDB does, the schema is enforced by ``query_metadata`` (a 422 naming the field) and advisory
for ``query`` with a vector, which filters every field."""

from __future__ import annotations

from typing import Any

from actors.engine.filters import FilterNode, pattern_paths
from actors.engine.fulltext import ANALYZER_VERSION
from actors.errors import InvalidRequest
from actors.types import IndexConfig

POLICIES = ("filterable", "pattern", "full_text")
BM25_K1, BM25_B = 1.2, 0.75  # CyborgDB's defaults


def parse(
    schema: dict[str, Any] | None, text_fields: list[str] | None = None
) -> tuple[tuple[str, bool, bool, bool], ...]:
    """The create request's schema as IndexConfig.metadata_schema, ``text_fields`` marked
    ``full_text`` (not filterable unless the schema says so); 422 for a malformed one."""
    schema = dict(schema or {})
    for field in text_fields or ():
        if not isinstance(field, str) or not field:
            raise InvalidRequest("text_fields must name metadata fields")
        policy = schema.get(field)
        schema[field] = {**(policy if isinstance(policy, dict) else {}), "full_text": True}
    out = []
    for field, policy in schema.items():
        if not field or not isinstance(policy, dict):
            raise InvalidRequest(
                f"metadata_schema[{field!r}] must be an object of {list(POLICIES)} flags"
            )
        unknown = set(policy) - set(POLICIES)
        if unknown:
            raise InvalidRequest(f"metadata_schema[{field!r}]: unknown policy {sorted(unknown)}")
        if any(not isinstance(v, bool) for v in policy.values()):
            raise InvalidRequest(f"metadata_schema[{field!r}]: policies are true or false")
        full_text = policy.get("full_text", False)
        filterable = policy.get("filterable", not full_text)
        pattern = policy.get("pattern", False)
        if pattern and full_text:
            raise InvalidRequest(f"metadata_schema[{field!r}]: full_text excludes pattern")
        if pattern and not filterable:
            raise InvalidRequest(f"metadata_schema[{field!r}]: pattern needs filterable")
        out.append((field, filterable, pattern, full_text))
    return tuple(out)


def bm25(
    fields: tuple[tuple[str, bool, bool, bool], ...], k1: float | None, b: float | None
) -> tuple[float, float] | None:
    """IndexConfig.bm25 of a create request: (k1, b) when a field is full_text; 422 for a
    k1 or b given without one."""
    if not any(full_text for *_, full_text in fields):
        if k1 is not None or b is not None:
            raise InvalidRequest("bm25_k1 and bm25_b need a full_text field (text_fields)")
        return None
    return (BM25_K1 if k1 is None else k1, BM25_B if b is None else b)


def describe_bm25(cfg: IndexConfig) -> dict[str, Any] | None:
    if cfg.bm25 is None:
        return None
    return {"k1": cfg.bm25[0], "b": cfg.bm25[1], "analyzer_version": ANALYZER_VERSION}


def describe(cfg: IndexConfig) -> dict[str, dict[str, bool]]:
    return {
        name: {"filterable": f, "pattern": p, "full_text": t}
        for name, f, p, t in cfg.metadata_schema
    }


def enforce(cfg: IndexConfig, node: FilterNode | None) -> None:
    """query_metadata's rules: no condition on a field declared not filterable, and
    ``$regex``/``$contains`` only on ``pattern`` fields."""
    if node is None:
        return
    policies = {name: (f, p) for name, f, p, _ in cfg.metadata_schema}
    for path, kind in pattern_paths(node):
        filterable, pattern = policies.get(path, (True, False))
        if not filterable:
            raise InvalidRequest(
                f"query_metadata: field {path!r} is not filterable (metadata_schema); "
                "query with a vector filters it"
            )
        if kind != "compare" and not pattern:
            raise InvalidRequest(
                f"query_metadata: ${kind} needs a pattern field, and {path!r} is not one "
                "(metadata_schema); query with a vector accepts it"
            )
