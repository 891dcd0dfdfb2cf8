"""The garbage collector's pauses in a server process, timed for --timeline: a full
collection over a process's objects stops it for tens of milliseconds or more."""
import gc
import time


class GcPauses:
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
