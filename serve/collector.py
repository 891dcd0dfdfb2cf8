"""The garbage collector in a server process: a full collection over every object the
process holds stopped a server on an H200 for 157 ms at the start of a level
(docs/log/2026-11-29-server-warm-up-whole-step.md)."""
import gc
import time


class GcPauses:
    """The collector's pauses, timed for --timeline."""

    def __init__(self):
        self.seconds = 0.0  # paused since the last take
        self.started = None
        gc.callbacks.append(self.on_collection)

    def on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            self.seconds += time.perf_counter() - self.started
            self.started = None

    def take(self) -> float:
        """Seconds paused since the last take."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def stop(self) -> None:
        """No more timing: the callback leaves the collector (one left behind in a test's
        process ran at every later collection, and met that process's interrupt at its end)."""
        if self.on_collection in gc.callbacks:
            gc.callbacks.remove(self.on_collection)


def freeze_start_up_objects() -> None:
    """Once a process has started (imports, engine, warm-up): what is left is kept for good,
    so no collection walks it again (vLLM freezes its heap after start-up too)."""
    gc.collect()
    gc.freeze()
