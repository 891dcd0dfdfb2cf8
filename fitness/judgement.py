"""Judge one candidate file in this process: static, target, derived, bench.

`judge_file` never raises: whatever the candidate does, it returns a verdict dict. The
sandbox runs it in a child process (`python -m fitness.judgement SPEC OUT`), so that a
hang, a CUDA error or a dead interpreter also ends as a verdict.
"""
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from fitness import gate
from fitness.loader import load_engine_module, source_hash
from fitness.model_config import ConfigError, ModelConfig

STATUSES = ("ok", "incorrect", "crash", "timeout", "invalid")


def new_verdict(path, device: str, seed: int) -> dict:
    return {"status": "", "stage": "", "error": "", "case": "", "worst_ratio": None,
            "worst_case": "", "seed": seed, "tokens_per_second": {}, "cases": [],
            "peak_memory_mb": None, "seconds": 0.0, "device": device,
            "path": str(path), "source_hash": ""}


def error_text(err: BaseException, limit: int = 1500) -> str:
    """The exception and the last frames of its traceback, short enough for a CSV cell."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return text[-limit:]


def judge_file(path, config_path, weight_dir, device: str, seed: int | None = None,
               scratch=None, margin: float = gate.DEFAULT_MARGIN, derived: bool = True,
               bench: str = "public", repeat: int = 3) -> dict:
    """The verdict on one file; stages cheapest first, the first failure ends it."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    verdict = new_verdict(path, device, seed)
    started = time.perf_counter()
    stage = "static"
    try:
        source = Path(path).read_text()
        verdict["source_hash"] = source_hash(source)
        problems = gate.static_problems(source)
        if problems:
            return finish(verdict, started, "invalid", stage, "; ".join(problems))
        config = ModelConfig.load(config_path)
        stage = "import"
        module = load_engine_module(path)
        stage = "target"
        scratch = scratch or tempfile.mkdtemp(prefix="judge_weights_")
        result = gate.run_gate(module, config, weight_dir, device, seed, scratch, margin, derived)
        verdict.update(worst_ratio=result.worst_ratio, worst_case=result.worst_case)
        if not result.passed:
            verdict["case"] = result.case
            return finish(verdict, started, "incorrect", result.stage, result.error)
        if bench != "none":
            stage = "bench"
            record_bench(verdict, module, config_path, weight_dir, device, bench, repeat)
        return finish(verdict, started, "ok", "", "")
    except ConfigError as err:
        return finish(verdict, started, "invalid", "config", str(err))
    except Exception as err:  # the candidate's failure is a verdict, never ours
        return finish(verdict, started, "crash", stage, error_text(err))


def record_bench(verdict: dict, module, config_path, weight_dir, device, choice, repeat) -> None:
    from fitness.bench import run_benchmark, select_cases

    raw_config = json.loads(Path(config_path).read_text())
    results = run_benchmark(module, raw_config, str(weight_dir), device, select_cases(choice),
                            repeat=repeat)
    verdict["cases"] = results
    verdict["tokens_per_second"] = {r["case_name"]: r["tokens_per_second"] for r in results}
    verdict["peak_memory_mb"] = max(r["peak_memory_mb"] for r in results)


def finish(verdict: dict, started: float, status: str, stage: str, error: str) -> dict:
    assert status in STATUSES, status
    verdict.update(status=status, stage=stage, error=error,
                   seconds=round(time.perf_counter() - started, 3))
    return verdict


def main(argv) -> int:
    """Child-process entry: read a spec JSON, write the verdict JSON."""
    spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    verdict = judge_file(**spec)
    tmp = Path(out_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(verdict))
    tmp.replace(out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
