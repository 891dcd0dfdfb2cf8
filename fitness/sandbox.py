"""Judge a candidate in a child process with a hard timeout.

A crash, a hang, a CUDA error, an out-of-memory or a dead interpreter in the candidate
becomes a verdict dict here; nothing the candidate does raises in, or hangs, the caller.
"""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fitness.judgement import new_verdict

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 600
STDERR_TAIL = 1500


def judge(path, config_path, weight_dir, device: str, timeout: float = DEFAULT_TIMEOUT_S,
          env: dict | None = None, **options) -> dict:
    """The verdict on `path`; `options` go to fitness.judgement.judge_file."""
    seed = options.get("seed")
    if seed is None:
        options["seed"] = seed = int.from_bytes(os.urandom(4), "little")
    spec = {"path": str(Path(path).resolve()), "config_path": str(Path(config_path).resolve()),
            "weight_dir": str(Path(weight_dir).resolve()), "device": device, **options}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="judge_") as tmp:
        spec_file, out_file, err_file = (Path(tmp) / n for n in ("spec.json", "verdict.json", "stderr.txt"))
        spec_file.write_text(json.dumps(spec, default=str))
        with open(err_file, "w") as stderr:
            status = run_child(spec_file, out_file, stderr, timeout, env, device)
        if out_file.exists():
            return json.loads(out_file.read_text())
        verdict = new_verdict(path, device, seed)
        tail = err_file.read_text()[-STDERR_TAIL:]
        if status == "timeout":
            verdict.update(status="timeout", error=f"no verdict within {timeout:g} s\n{tail}")
        else:
            verdict.update(status="crash", error=f"judge process {status}\n{tail}")
        verdict["seconds"] = round(time.perf_counter() - started, 3)
        return verdict


def run_child(spec_file: Path, out_file: Path, stderr, timeout: float, env, device: str) -> str:
    """Run the judgement child; returns 'exited N', 'killed by SIGNAL' or 'timeout'."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
    # A session of its own, so a timeout kills the candidate's own children too.
    limit = cpu_memory_limit() if device == "cpu" else None
    proc = subprocess.Popen([sys.executable, "-m", "fitness.judgement", str(spec_file), str(out_file)],
                            stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                            env=child_env, cwd=REPO_ROOT, start_new_session=True,
                            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
                            if limit else None)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        return "timeout"
    except BaseException:  # Ctrl-C or SIGTERM in the caller: take the child down with us
        kill_session(proc)
        raise
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited {code}"


def cpu_memory_limit() -> int:
    """Address space a CPU judgement may take: half the machine's memory. A candidate that
    asks for more fails its own allocation (a crash verdict) instead of waking the kernel's
    OOM killer, which picks its victim machine-wide (seen: 24 GB by one slab-cache child).
    Not for CUDA judgements: the driver reserves far more address space than it uses."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
