"""Judging from outside: a warm judge process per device (`JudgeProcess`), or one judgement
made here (`judge`).

A candidate never runs in the caller's process nor in the judge's: the judge
(fitness.judge, fitness.worker) starts a runner process per candidate, so a crash, a
hang, a CUDA error, an out-of-memory or a dead interpreter is a verdict, and nothing the
candidate does raises in, or hangs, the caller. A judge process that stops answering is
killed and started again; the judgement it was making is a crash verdict.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fitness.judge import Judge
from fitness.timing import fresh_seed
from fitness.verdict import new_verdict

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 600
ANSWER_GRACE_S = 60.0  # beyond the judgement's own timeout, which the judge enforces itself


def judge(path, config_path, weight_dir, device: str, timeout: float = DEFAULT_TIMEOUT_S,
          env: dict | None = None, scratch=None, threads: int | None = None, **options) -> dict:
    """One judgement, the judge in this process; `options` go to Judge.judge."""
    options["seed"] = fresh_seed() if options.get("seed") is None else options["seed"]
    judge_ = Judge(device, env=env, scratch=scratch, threads=threads, spare_ahead=False)
    try:
        return judge_.judge(path, config_path, weight_dir, timeout=timeout, **options)
    finally:
        judge_.close()


class JudgeProcess:
    """A `python -m fitness.worker` kept warm; `judge` sends it one request at a time."""

    def __init__(self, device: str, env: dict | None = None, cpus: str = "", scratch=None):
        self.device, self.env, self.cpus, self.scratch = device, dict(env or {}), cpus, scratch
        self.proc = None

    def start(self) -> None:
        command = [sys.executable, "-m", "fitness.worker", "--device", self.device]
        command += ["--cpus", self.cpus] if self.cpus else []
        command += ["--scratch", str(self.scratch)] if self.scratch else []
        child_env = {**os.environ, **self.env}
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
        self.stderr = tempfile.TemporaryFile()
        # A session of its own: a terminal's Ctrl-C goes to the search, which stops judges itself.
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=child_env, cwd=REPO_ROOT, start_new_session=True, text=True)

    def judge(self, path, config_path, weight_dir, timeout: float = DEFAULT_TIMEOUT_S, **options) -> dict:
        return self.judge_group([path], config_path, weight_dir, timeout, **options)[0]

    def judge_group(self, paths, config_path, weight_dir, timeout: float = DEFAULT_TIMEOUT_S, **options) -> list:
        """A verdict on each path, judged together (fitness.judge.Judge.judge_group)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        options["seed"] = fresh_seed() if options.get("seed") is None else options["seed"]
        request = {"paths": [str(Path(p).resolve()) for p in paths], "config_path": str(Path(config_path).resolve()),
                   "weight_dir": str(Path(weight_dir).resolve()), "timeout": timeout, **options}
        started = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps(request, default=str) + "\n")
            self.proc.stdin.flush()
            verdicts = json.loads(self.read_line(timeout + ANSWER_GRACE_S))
            if not isinstance(verdicts, list) or len(verdicts) != len(paths):
                raise ValueError(f"{len(paths)} paths judged, answered with {str(verdicts)[:200]}")
            return verdicts
        except (OSError, ValueError, TimeoutError) as err:
            error = f"the judge process failed ({err}); {self.stderr_tail()}"
            self.stop()  # the next judgement gets a fresh judge
            verdicts = [new_verdict(path, self.device, options["seed"]) for path in paths]
            for verdict in verdicts:
                verdict.update(status="crash", stage="judge", seconds=round(time.monotonic() - started, 3), error=error)
            return verdicts

    def read_line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no verdict within {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise OSError(f"the judge process ended ({self.proc.poll()})")
        return line

    def stderr_tail(self, limit: int = 800) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-limit:]

    def stop(self) -> None:
        """End the judge and, through it, the runner it is driving."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # it kills its runners on the way out
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # runners die with it (PDEATHSIG)
                self.proc.wait()
        self.proc = None
