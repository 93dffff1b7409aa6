"""CyborgDB's ``metadata_schema``: per metadata field, whether it is ``filterable``, whether it
takes ``pattern`` operators (``$regex``, ``$contains``) and whether it is ``full_text`` (BM25,
which vaultvec refuses at create). Fields the schema does not name are filterable. As CyborgDB
does, the schema is enforced by ``query_metadata`` (a 422 naming the field) and advisory for
``query`` with a vector, which filters every field."""

from __future__ import annotations

from typing import Any

from actors.engine.filters import FilterNode, pattern_paths
from actors.errors import InvalidRequest
from actors.types import IndexConfig

POLICIES = ("filterable", "pattern", "full_text")


def parse(schema: dict[str, Any] | None) -> tuple[tuple[str, bool, bool, bool], ...]:
    """The create request's schema as IndexConfig.metadata_schema; 422 for a malformed one."""
    out = []
    for field, policy in (schema or {}).items():
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
        if pattern and not filterable:
            raise InvalidRequest(f"metadata_schema[{field!r}]: pattern needs filterable")
        out.append((field, filterable, pattern, full_text))
    return tuple(out)


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
