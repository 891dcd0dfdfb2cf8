"""`python -m tests.subreaper CMD...`: run CMD, then say whether any process it started
outlived it.

This process becomes a child subreaper (Linux prctl), so every descendant of CMD that is
orphaned (a judge, a runner, in sessions of their own) becomes its child: once CMD has
ended, a child still alive is a leak. SIGTERM is passed on to CMD. Exit status: CMD's
(143 when a signal ended it), or LEAKED when something outlived it.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
LEAKED = 99
GRACE_S = 5.0  # runners die with their judge (PDEATHSIG): give the kernel a moment


def any_child_alive(grace_s: float) -> bool:
    """Reap the orphans that ended; True if one is still alive after `grace_s`."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False  # no children left
        if pid == 0:  # children remain, none ended just now
            if time.monotonic() > deadline:
                return True
            time.sleep(0.1)


def main(command: list) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    proc = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    status = proc.wait()
    if any_child_alive(GRACE_S):
        print(f"subreaper: a process started by {command[:3]} outlived it", flush=True)
        return LEAKED
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
