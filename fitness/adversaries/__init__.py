"""Engines the judge must reject, or time at their real speed, each an exact edit of the seed's
source: planted faults (wrong logits, a crash, a hang, a forbidden import: `planted`) and cheats
(of the clock, the comparison, the weight files, the inputs, the knowledge of being timed:
`cheats`). Data, not tests: tests/test_gate.py and tests/test_cheats.py hold the judge to them,
and tools/cheat_verdicts.py judges each beside the seed on a GPU. fitness/README.md says which
defence closes which cheat."""
