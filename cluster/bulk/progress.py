"""The bulk driver's record of a job: the sidecar progress file and the final ``Report``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cluster.bulk.files import atomic_write


# -- progress file --------------------------------------------------------------------------
class Progress:
    """The sidecar ``*.progress.json``: what the job is and how far it got (atomic rewrites)."""

    def __init__(self, path: Path, job: dict[str, Any]) -> None:
        self.path = path
        self.job = job

    @staticmethod
    def recorded(path: Path, key: str) -> Any:
        """``key`` of the job recorded at ``path`` (None without a readable progress file)."""
        try:
            job = orjson.loads(path.read_bytes()).get("job")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return None
        return job.get(key) if isinstance(job, dict) else None

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        state = orjson.loads(self.path.read_bytes())
        if state.get("job") != self.job:
            diff = sorted(
                k
                for k in set(self.job) | set(state.get("job", {}))
                if self.job.get(k) != state.get("job", {}).get(k)
            )
            raise ValueError(
                f"{self.path} belongs to a different job (differs in: {', '.join(diff)}); "
                "re-run with the same options to resume, or pass --restart to start over"
            )
        return dict(state)

    def save(self, done: dict[str, Any], complete: bool = False) -> None:
        state = {"job": self.job, "done": done, "complete": complete, "saved": time.time()}
        atomic_write(self.path, orjson.dumps(state, option=orjson.OPT_INDENT_2))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# -- reports --------------------------------------------------------------------------------
@dataclass
class Report:
    kind: str  # "query" or "upsert"
    rows_total: int
    rows_done: int = 0  # a prefix of the input, written (query) or acknowledged (upsert)
    batches_done: int = 0
    batch_size: int = 0
    resumed_from: int = 0
    complete: bool = False
    interrupted: bool = False
    error: BaseException | None = None
    where: str = ""
    progress_file: str = ""
    seconds: float = 0.0
    extra_acknowledged: int = 0  # upsert rows acknowledged beyond the recorded prefix
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.complete and self.error is None

    def summary(self) -> str:
        unit = "queries" if self.kind == "query" else "vectors"
        new = self.rows_done - self.resumed_from
        rate = new / self.seconds if self.seconds > 0 else 0.0
        timing = f"{new:,} {unit} in {self.seconds:.1f}s ({rate:,.0f}/s)"
        if self.complete:
            start = f" (resumed at row {self.resumed_from:,})" if self.resumed_from else ""
            return f"done: all {self.rows_total:,} {unit} -> {self.where}{start}; {timing}"
        written = "written" if self.kind == "query" else "acknowledged"
        if self.rows_done:
            rows = f"rows 0-{self.rows_done - 1:,} ({self.batches_done:,} batches of {self.batch_size:,}) are {written}"
        else:
            rows = f"no rows are {written}"
        why = "interrupted" if self.error is None else f"stopped by an error: {self.error}"
        lines = [
            f"{why}",
            f"{rows} of {self.rows_total:,}: {self.where}; recorded in {self.progress_file}",
        ]
        if self.extra_acknowledged:
            lines.append(
                f"{self.extra_acknowledged:,} more rows of later batches were acknowledged too; "
                "a resumed run sends them again (upserts replace by id, so this is safe)"
            )
        lines.append(f"re-run the same command to resume at row {self.rows_done:,}; {timing}")
        return "\n".join(lines)
