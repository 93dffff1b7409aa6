"""MongoDB-style metadata filters, re-exported from two modules.

``tree``: the filter language and its matching rules (the module docstring), the typed filter tree
and ``parse_filter``, which validates a filter object into it. ``columns``: ``MetadataColumns``,
the columnar metadata store, and its vectorised evaluator of a tree to a numpy bool mask.
"""

from actors.engine.filters.columns import MetadataColumns
from actors.engine.filters.tree import (
    And,
    Cmp,
    Exists,
    FilterNode,
    Not,
    Or,
    Pattern,
    parse_filter,
    pattern_paths,
)

__all__ = [
    "And",
    "Cmp",
    "Exists",
    "FilterNode",
    "MetadataColumns",
    "Not",
    "Or",
    "Pattern",
    "parse_filter",
    "pattern_paths",
]
