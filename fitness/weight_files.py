"""The weight files a judge compares with (and the model's config), held to what they were
when it first trusted them.

A candidate runs as its judge's user and is handed the weight directories, so it can
rewrite model.pt. Its own judgement is unharmed (the judge loaded the reference first), but
a reference loaded later, by another judge process or after an eviction, would be the
candidate's model: a planted engine that zeroed the file and answered zeros was judged
`ok` at 500x the seed on its second judgement. So a file is trusted once: generated weights
when the judge has read back what it generates (`holds`), the target when first read, or
as the search found it before any candidate ran. The config file too: a judge reads it anew
for each judgement, and one a candidate cut to fewer layers would judge every later program
on another model. Every trusted file is checked before a reference is loaded and after every
judgement; any write changes a file's ctime, which no process can set back.
"""
import threading
from pathlib import Path

import torch

from contract.checkpoint import checkpoint_files, read_weights
from contract.model_config import ConfigError
from fitness.own_code import file_mark


class WeightsChanged(Exception):
    """A trusted weight file changed: no verdict given while it could have is trusted."""


def fingerprint(weight_dir) -> tuple:
    """What identifies each weight file of `weight_dir` (model.pt, or a Hugging Face
    checkpoint's safetensors and index), or the one file it names, as written: device, inode,
    size, mtime, ctime."""
    files = [weight_dir] if Path(weight_dir).is_file() else checkpoint_files(weight_dir)
    # Flat, so that it survives a trip through JSON to a judge process unchanged.
    return tuple(n for path in files for n in file_mark(path))


class TrustedFiles:
    def __init__(self):
        self.known = {}  # resolved weight dir -> fingerprint when trusted
        self.lock = threading.Lock()

    def trust(self, weight_dir, expected=None, anew: bool = False) -> None:
        """Trust the file as it is now, unless it is already trusted (then it must not have
        changed) or `expected`, its fingerprint taken elsewhere, differs; `anew`: as it is
        now (or as `expected`), whatever was trusted before."""
        key = str(Path(weight_dir).resolve())
        now = current(key)
        with self.lock:
            if now is None and key not in self.known and expected is None:
                return  # nothing there to trust: its reader says what is missing
            vouched = now if expected is None else tuple(expected)
            if anew:
                self.known[key] = vouched
            trusted = self.known.setdefault(key, vouched)
        if trusted != now:
            raise WeightsChanged(f"{key} changed on disk since the judge trusted it")

    def intact(self, weight_dir) -> bool:
        """Trusted, and unchanged since."""
        key = str(Path(weight_dir).resolve())
        with self.lock:
            return key in self.known and current(key) == self.known[key]

    def check(self) -> None:
        """WeightsChanged naming every trusted file that changed (they stay trusted as they
        were: every judgement after fails too)."""
        with self.lock:
            changed = [key for key, trusted in self.known.items() if current(key) != trusted]
        if changed:
            raise WeightsChanged(f"{', '.join(changed)} changed on disk while candidates ran")


def holds(weight_dir, wanted: dict, config) -> bool:
    """Whether weight_dir's checkpoint (model.pt, or a Hugging Face one) holds exactly
    `wanted` (the contract's names and layout), read under one fingerprint; if so, it is
    trusted as it is (the judge's own weights, however old the file)."""
    before = current(weight_dir)
    if before is None:
        return False
    try:
        found = read_weights(weight_dir, config)
    except Exception:  # a candidate's scribble, or half a file
        return False
    equal = found.keys() == wanted.keys() and all(torch.equal(found[k], wanted[k]) for k in wanted)
    if not equal or current(weight_dir) != before:
        return False
    TRUSTED.trust(weight_dir, expected=before, anew=True)  # raises if it changed just now
    return True


def current(weight_dir: str):
    try:
        return fingerprint(weight_dir)
    except (OSError, ConfigError):
        return None


TRUSTED = TrustedFiles()  # one per judge process: every judge in it reads the same files
