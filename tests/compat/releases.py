"""The pinned ``cyborgdb`` SDK releases the compatibility suite drives, and the one list of
checks that are expected to fail because the server feature is out of vaultvec's scope.

Check names are ``<scenario>/<check>`` (see ``driver.py``); a known-unsupported entry matches
them with a shell-style pattern. Every other failed check fails the test.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

RELEASES: tuple[str, ...] = (
    "0.11.0",
    "0.12.0",
    "0.13.1",
    "0.14.0",
    "0.15.0",
    "0.16.0",
    "0.17.0",
    "0.18.0",
)


@dataclass(frozen=True)
class Unsupported:
    pattern: str  # matched against check names with fnmatch
    since: str  # first SDK release that has the feature (documentation only)
    reason: str


KNOWN_UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(
        "kms/*",
        "0.17.0",
        "KMS-backed index keys (create_index(kms_name=...)): vaultvec indexes are always keyed "
        "by the client's index_key",
    ),
)


def known_unsupported(check: str) -> Unsupported | None:
    """The entry that excuses a failure of ``check``, if any."""
    for entry in KNOWN_UNSUPPORTED:
        if fnmatch.fnmatchcase(check, entry.pattern):
            return entry
    return None


def markdown_table() -> str:
    """The known-unsupported list as a README table (``python -m tests.compat.releases``)."""
    rows = ["| SDK feature | since | why it fails against vaultvec |", "|---|---|---|"]
    rows += [f"| `{e.pattern}` | {e.since} | {e.reason} |" for e in KNOWN_UNSUPPORTED]
    return "\n".join(rows)


if __name__ == "__main__":
    print(f"Releases tested: {', '.join(RELEASES)}\n")
    print(markdown_table())
