"""The verdict on one candidate: a small, JSON-serialisable dict the loop branches on."""
import traceback

STATUSES = ("ok", "incorrect", "crash", "timeout", "invalid")


def new_verdict(path, device: str, seed: int) -> dict:
    return {"status": "", "stage": "", "error": "", "case": "", "worst_ratio": None,
            "worst_case": "", "seed": seed, "level": "", "tokens_per_second": {}, "cases": [],
            "peak_memory_mb": None, "seconds": 0.0, "device": device, "path": str(path),
            "source_hash": "", "rounds": 0, "fitness_cv": None, "open_layers": ""}


def error_text(err: BaseException, limit: int = 1500) -> str:
    """The exception and the last frames of its traceback, short enough for a CSV cell."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return text[-limit:]
