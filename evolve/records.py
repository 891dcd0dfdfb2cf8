"""The files a run keeps for later runs (history.csv, its checkpoint), held to what it last
wrote them as.

A candidate runs as the search's user and can write them: a row saying a program it wrote
was judged correct and fast (a later run's --seed-from takes it as confirmed, and its final
keeps it), a checkpoint that --resume unpickles. Each is checked before the run writes it
again and after every batch of judgements; any write changes a file's ctime, which no
process can set back.
"""
from pathlib import Path

from fitness import own_code


class RecordsChanged(Exception):
    """A file only this run writes changed on disk: a candidate wrote it."""


def file_mark(path: Path):
    """own_code.file_mark, or None when there is no file."""
    try:
        return own_code.file_mark(path)
    except FileNotFoundError:
        return None


class Written:
    """One file as this run found it or last wrote it (callers hold their own locks)."""

    def __init__(self, path):
        self.path = Path(path)
        self.mark = file_mark(self.path)

    def wrote(self) -> None:
        self.mark = file_mark(self.path)

    def check(self) -> None:
        if file_mark(self.path) != self.mark:
            raise RecordsChanged(f"{self.path} changed on disk since this run last wrote it")
