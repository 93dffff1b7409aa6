"""MongoDB-style metadata filters; the code lives in ``actors.filters.tree``."""

from actors.filters.tree import (
    And,
    Cmp,
    Exists,
    FilterNode,
    MetadataColumns,
    Not,
    Or,
    parse_filter,
)

__all__ = ["And", "Cmp", "Exists", "FilterNode", "MetadataColumns", "Not", "Or", "parse_filter"]
