"""Child processes at once, each on a core of its own: tests whose work is one long chain
(a random walk, an interpreted engine) split it into processes this way."""
import subprocess

from tests.conftest import REPO


def side_by_side(commands: list, timeout: float, env: dict | None = None) -> list:
    """Run every command at once from the repository's root; what each printed, as
    subprocess.run gives it. Any still running when one fails or times out is killed."""
    runs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for command in commands]
    done = []
    try:
        for command, run in zip(commands, runs):
            out, err = run.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(command, run.returncode, out, err))
    finally:
        for run in runs:
            run.kill()
    return done
