"""What a run's ``--keep-columns`` changes against the live version: the columns it adds and drops.

NOTE: a rerun without the flag publishes a version that keeps no column (README: to keep none, leave the flag out),
and it said nothing: its summary read "0 added, 0 changed, 0 removed, N unchanged", and every ``--where`` on the
dropped columns exited 2 from then on (a cron job that forgot the flag). The change is now said on stderr (a
warning when columns are dropped, with the flag that keeps them), in the report (``kept_column_changes``) and in the
summary line.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.notes import say


@dataclass(frozen=True)
class KeptColumnsChange:
    """The live version's kept columns (``before``, of version ``version_before``) and this run's (``after``)."""

    version_before: str
    before: tuple[str, ...]
    after: tuple[str, ...]

    @classmethod
    def between(cls, live: Manifest | None, keep: tuple[str, ...]) -> KeptColumnsChange | None:
        """The change from ``live`` (the live version, ``None``: none, or unreadable) to ``keep``; ``None`` when the
        run keeps the same columns in the same order."""
        if live is None or live.kept_columns == tuple(keep):
            return None
        return cls(live.version, live.kept_columns, tuple(keep))

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(name for name in self.after if name not in self.before)

    @property
    def dropped(self) -> tuple[str, ...]:
        return tuple(name for name in self.before if name not in self.after)

    def as_dict(self) -> dict[str, Any]:
        """The report's ``kept_column_changes``."""
        return {"before": list(self.before), "after": list(self.after), "added": list(self.added),
                "dropped": list(self.dropped)}

    def message(self) -> str:
        """What the published version keeps otherwise than the one before it: a warning naming the dropped columns
        and the flag that keeps them, else a note."""
        before = f"version {self.version_before} kept {_names(self.before)}"
        if self.dropped:
            them = "it" if len(self.dropped) == 1 else "them"
            keep = shlex.quote(",".join([*self.before, *self.added]))
            return (f"warning: --keep-columns: the new version no longer keeps {_names(self.dropped)} ({before}; "
                    f"this run keeps {_names(self.after)}): petal query --where on {them} exits 2 and hits no longer "
                    f"carry {them}; to keep {them}, pass --keep-columns {keep} on every run")
        if self.added:
            return f"note: --keep-columns: the new version keeps {_names(self.added)} too ({before})"
        return f"note: --keep-columns: the new version keeps {_names(self.after)} in this order ({before})"


def _names(columns: tuple[str, ...]) -> str:
    return ", ".join(repr(name) for name in columns) if columns else "no column"


def say_kept_columns(change: KeptColumnsChange | None) -> None:
    """Said on stderr once the version is published (``-q`` too; the API's ``quiet``: the ``petal`` logger)."""
    if change is not None:
        say(change.message())
