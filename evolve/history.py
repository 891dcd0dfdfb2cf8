"""history.csv: one row per judged candidate (and per declined rewrite), across runs.

The column list is defined once, here; rows are appended and flushed one at a time, so a
run killed at any moment leaves every finished judgement on disk. Reading skips a
damaged line with a warning instead of failing.

Users read histories across runs and versions, so each row carries `schema_version`, and
`read` takes every layout this tool has written, filling the columns an older one lacks:

| version | from | what changed |
|---|---|---|
| 1 | 2026-11-21 | the first: tps of the public and hidden-style cases (prefill_4x128, hidden_mixed among them) |
| 2 | 2026-11-21 | the hidden-style cases renamed (decode_8x128x16, mixed_128) |
| 3 | 2026-11-22 | level, baseline_id, ratio and its interval, rounds, fitness_cv (screens beside a parent) |
| 4 | 2026-11-22 | the CPU's small cases |
| 5 | 2026-11-25 | the large and long cases |
| 6 | 2026-11-26 | judge_phases |
| 7 | 2026-11-28 | schema_version |
| 8 | 2026-12-01 | open_layers (what of fitness/isolation.py its runners went without; "" when nothing) |

A file keeps the header it was started with: a run appending to an older history writes
its rows in that layout.
"""
import csv
import json
import math
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from evolve.records import Written
from fitness.cases import select_cases


def case_names() -> tuple:
    """Every throughput case a judgement can time, public first."""
    return sum((tuple(select_cases(which)) for which in ("all", "small", "large", "long")), ())


def tps_column(case: str) -> str:
    return f"tps_{case}"


BASE_COLUMNS = ("run_id", "generation", "candidate_id", "parent_ids", "operator", "operator_args",
                "status", "stage", "worst_ratio")
TAIL_COLUMNS = ("peak_memory_mb", "fitness", "level", "baseline_id", "ratio", "ratio_low", "ratio_high",
                "rounds", "fitness_cv", "judge_seconds", "judge_phases", "device", "source_path", "timestamp", "error",
                "target", "schema_version", "open_layers")
COLUMNS = BASE_COLUMNS + tuple(tps_column(c) for c in case_names()) + TAIL_COLUMNS
NUMERIC = ("generation", "worst_ratio", "peak_memory_mb", "fitness", "ratio", "ratio_low", "ratio_high",
           "rounds", "fitness_cv", "judge_seconds", "schema_version")
SCHEMA_VERSION = 8
# A header without schema_version is told by the newest column it has (the docstring's table).
SCHEMA_MARKERS = ((6, "judge_phases"), (5, "tps_mixed_long"), (4, "tps_mixed_small"), (3, "baseline_id"),
                  (1, "tps_hidden_mixed"))
TEXT = ("run_id", "candidate_id", "parent_ids", "operator", "operator_args", "status", "stage", "source_path",
        "level", "baseline_id", "device", "timestamp", "error", "target", "judge_phases", "open_layers")
# Rows that judge a program already in the history again rather than add one: the full
# gate after a screen, and the final re-measure against the seed ("retime": the elite's
# re-timing, in histories of older runs).
CONFIRM, FINAL = "confirm", "final"
REMEASURE_OPERATORS = ("retime", FINAL, CONFIRM)
JUDGED_STATUSES = ("ok", "incorrect", "crash", "timeout", "invalid")
ERROR_CHARS = 300


def short_error(text: str) -> str:
    """The first and last line of an error, on one line, short enough for a CSV cell."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text[:ERROR_CHARS]


class History:
    """Appends rows to one CSV file; safe to call from several judging threads. No one else
    may write it meanwhile (evolve.records)."""

    def __init__(self, path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.columns = existing_header(self.path) or COLUMNS
        self.written = Written(self.path)

    def append(self, row: dict) -> None:
        """Write one row now; values for columns the file lacks are dropped."""
        row = {**row, "timestamp": row.get("timestamp") or time.strftime("%Y-%m-%dT%H:%M:%S"),
               "error": short_error(row.get("error", "")), "schema_version": SCHEMA_VERSION}
        with self.lock:
            self.written.check()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            is_new = not self.path.exists() or self.path.stat().st_size == 0
            with open(self.path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
                if is_new:
                    writer.writeheader()
                writer.writerow({k: cell(v) for k, v in row.items()})
                f.flush()
            self.written.wrote()

    def check(self) -> None:
        """RecordsChanged when the file changed since this run last wrote it."""
        with self.lock:
            self.written.check()


def cell(value):
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, (list, tuple)):
        return ";".join(map(str, value))
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return "" if value is None else value


def existing_header(path: Path) -> tuple | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    return tuple(header) if header else None


def verdict_row(verdict: dict, fitness: float) -> dict:
    """The columns a judge's verdict fills."""
    row = {"status": verdict["status"], "stage": verdict.get("stage", ""),
           "worst_ratio": verdict.get("worst_ratio"), "peak_memory_mb": verdict.get("peak_memory_mb"),
           "fitness": fitness, "level": verdict.get("level", ""), "ratio": verdict.get("ratio"),
           "ratio_low": verdict.get("ratio_low"), "ratio_high": verdict.get("ratio_high"),
           "rounds": verdict.get("rounds"), "fitness_cv": verdict.get("fitness_cv"),
           "judge_seconds": verdict.get("seconds"), "judge_phases": verdict.get("phases"),
           "device": verdict.get("device"), "open_layers": verdict.get("open_layers", ""),
           "error": verdict.get("error", "")}
    for case, tps in (verdict.get("tokens_per_second") or {}).items():
        row[tps_column(case)] = tps
    return row


def read(path, warn=None) -> pd.DataFrame:
    """Every readable row of a history file; a damaged line is skipped with a warning."""
    warn = warn or (lambda message: print(f"warning: {message}", file=sys.stderr))
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header:
            return pd.DataFrame(columns=list(COLUMNS))
        rows = []
        for line_no, fields in enumerate(reader, start=2):
            problem = damage(header, fields)
            if problem:
                warn(f"{path}:{line_no}: skipped a damaged line ({problem})")
                continue
            rows.append(fields)
    frame = pd.DataFrame(rows, columns=header)
    if "schema_version" not in frame.columns:
        frame["schema_version"] = schema_of(header)
    for column in COLUMNS:  # an older layout's missing columns, empty
        if column not in frame.columns:
            frame[column] = "" if column in TEXT else float("nan")
    for column in frame.columns:
        if column in NUMERIC or column.startswith("tps_"):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in TEXT:
        frame[column] = frame[column].fillna("").astype(str)
    return frame


def schema_of(header: list) -> int:
    """The version of a header written before schema_version was a column."""
    return next((version for version, marker in SCHEMA_MARKERS if marker in header), 2)


def damage(header: list, fields: list) -> str:
    """Why a line cannot be a row of this file, or "" when it can."""
    if len(fields) != len(header):
        return f"{len(fields)} fields, expected {len(header)}"
    row = dict(zip(header, fields))
    for column in NUMERIC:
        value = row.get(column, "")
        if value:
            try:
                float(value)
            except ValueError:
                return f"{column} is {value[:20]!r}"
    if row.get("status", "") not in JUDGED_STATUSES + ("declined",):
        return f"status is {row.get('status', '')[:20]!r}"
    return ""


def judged_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of candidates judged for the first time (no re-measures, no declines)."""
    return frame[frame["status"].isin(JUDGED_STATUSES) & ~frame["operator"].isin(REMEASURE_OPERATORS)]


def origins(frame: pd.DataFrame) -> dict:
    """candidate id -> (parent ids, operator, operator args) of the row that first judged it."""
    found = {}
    for row in judged_rows(frame).itertuples(index=False):
        if row.candidate_id and row.candidate_id not in found:
            parents = [p for p in str(row.parent_ids).split(";") if p]
            found[row.candidate_id] = (parents, row.operator, str(getattr(row, "operator_args", "") or ""))
    return found


def lineage(frame: pd.DataFrame, candidate_id: str) -> list[dict]:
    """The steps from the oldest known ancestor to `candidate_id`, following first parents."""
    found, steps, seen = origins(frame), [], set()
    current = candidate_id
    while current in found and current not in seen:
        seen.add(current)
        parents, operator, args = found[current]
        steps.append({"candidate_id": current, "operator": operator, "operator_args": args,
                      "parent_ids": parents})
        current = parents[0] if parents else None
    return steps[::-1]
