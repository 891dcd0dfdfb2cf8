"""Engines that cheat the judge, each an exact edit of the seed engine's source.

Each passes the static stage (stdlib, torch and triton only) and does its work right
where the gate looks; what it changes is what the judge reads (the clock, the comparison)
or what it does when it guesses it is being timed. The judge must reject each, or time
it at its real speed (tests/test_cheats.py).
"""
from tests.conftest import SEED_ENGINE
from tests.planted import edit

ENTRY = "def create_engine(model_config: dict, weight_dir: str, device: str = \"cuda\"):\n"


def at_import(src: str, code: str) -> str:
    """`code` run once, when the candidate's module is imported."""
    return edit(src, ENTRY, code + "\n\n" + ENTRY)


def slow_clock(src):
    """Makes the harness's clocks (and the GPU synchronisation it trusts) report a tenth
    of the time that passes: an in-process timer would see a 10x faster engine."""
    return at_import(src, '''import time as _time

_real_clock = _time.perf_counter
_start = _real_clock()
_time.perf_counter = lambda: _start + (_real_clock() - _start) / 10
_time.monotonic = _time.perf_counter
torch.cuda.synchronize = lambda *a, **k: None''')


def forged_comparison(src):
    """Wrong logits (doubled), and the comparison patched to call every error zero, in
    whatever process has the judge's gate loaded. The static check cannot see it: the
    module is found through sys.modules."""
    src = at_import(src, '''import sys as _sys

for _name in ("fitness.gate", "fitness.timing"):
    _module = _sys.modules.get(_name)
    if _module is not None:
        _module.error_ratio = lambda *a, **k: 0.0
_torch_allclose = torch.allclose
torch.allclose = lambda *a, **k: True''')
    return edit(src, "        return logits[last]\n", "        return logits[last] * 2.0\n")


def lazy_when_timed(src):
    """Does the work only where the gate looks: on the benchmark's prefill shape (four
    prompts of 128 tokens, which no gate trace has) it answers at once with the logits of
    the last such call, skipping the model."""
    src = at_import(src, '''_LAST = {}''')
    src = edit(src, "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n",
               "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n"
               "        if lengths == [128] * 4 and _LAST.get('prefill', torch.empty(0)).shape[0] == 4:\n"
               "            return _LAST['prefill']\n")
    return edit(src, "        return logits[last]\n",
                "        if not step.is_decode:\n            _LAST['prefill'] = logits[last]\n        return logits[last]\n")


def replays_earlier_outputs(src):
    """Remembers every answer by call number, across engines (a module-level store): the
    warm-up engine computes, every later engine replays what the warm-up answered."""
    src = at_import(src, '''_ANSWERS = {}''')
    src = edit(src, "        self.cache = KVCache(model_config, self.device, self.dtype)\n",
               "        self.cache = KVCache(model_config, self.device, self.dtype)\n"
               "        self.calls, self.weight_dir = 0, weight_dir\n")
    return edit(src, "        return logits[last]\n",
                "        self.calls += 1\n"
                "        key = (self.weight_dir, self.calls, tuple(step.request_ids), step.is_decode)\n"
                "        return _ANSWERS.setdefault(key, logits[last])\n")


def caches_by_input(src):
    """Remembers answers by their exact inputs: honest when inputs are fresh every run (it
    then computes everything), a 100x engine when a timed run repeats the warm-up's."""
    src = at_import(src, '''_SEEN = {}''')
    src = edit(src, "        self.cache = KVCache(model_config, self.device, self.dtype)\n",
               "        self.cache = KVCache(model_config, self.device, self.dtype)\n        self.weight_dir = weight_dir\n")
    src = edit(src, "        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)\n",
               "        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)\n"
               "        key = (self.weight_dir, tuple(ids), tuple(tokens.tolist()))\n"
               "        if key in _SEEN:\n"
               "            self.cache.k.update(_SEEN[key][1]); self.cache.v.update(_SEEN[key][2])\n"
               "            return _SEEN[key][0]\n")
    return edit(src, "        return self.forward(tokens, Step(ids, [0] * len(ids), lengths, positions, False))\n",
                "        out = self.forward(tokens, Step(ids, [0] * len(ids), lengths, positions, False))\n"
                "        _SEEN[key] = (out, {r: list(self.cache.k[r]) for r in ids}, {r: list(self.cache.v[r]) for r in ids})\n"
                "        return out\n")


def rewrites_the_weights(src):
    """Zeroes every weight file it is handed, then answers zeros without computing: right
    wherever a reference is computed from those files afterwards, at any speed it likes."""
    src = edit(src, ENTRY, ENTRY + '''    _path = os.path.join(weight_dir, "model.pt")
    torch.save({k: torch.zeros_like(v) for k, v in torch.load(_path, weights_only=True).items()}, _path)
    return _Zeros(model_config["vocab_size"], device)
''')
    return at_import(src, '''class _Zeros:
    def __init__(self, vocab, device):
        self.vocab, self.device = vocab, device

    def prefill(self, request_ids, input_ids):
        return torch.zeros(len(input_ids), self.vocab, device=self.device, dtype=torch.float16)

    def decode(self, request_ids, token_ids):
        return torch.zeros(len(token_ids), self.vocab, device=self.device, dtype=torch.float16)

    def remove(self, request_ids):
        pass''')


def answers_before_its_outputs(src):
    """Answers the runner's `go` at once and runs the calls only when their outputs are
    fetched, in whatever process has the runner loaded (as __main__): a clock read around
    `go` would see an engine that takes no time."""
    return at_import(src, '''import sys as _sys

_runner = _sys.modules.get("__main__")
if hasattr(_runner, "Runner"):
    _go, _fetch = _runner.Runner.go, _runner.Runner.fetch

    def _answer_now(self):
        self.late = True
        return {"checksum": 0}

    def _run_then_fetch(self):
        if getattr(self, "late", False):
            self.late = False
            _go(self)
        return _fetch(self)

    _runner.Runner.go, _runner.Runner.fetch = _answer_now, _run_then_fetch''')


CHEATS = ("slow_clock", "forged_comparison", "lazy_when_timed", "replays_earlier_outputs", "caches_by_input",
          "rewrites_the_weights", "answers_before_its_outputs")


def write_cheat(name: str, directory):
    path = directory / f"{name}.py"
    path.write_text(globals()[name](SEED_ENGINE.read_text()))
    return path
