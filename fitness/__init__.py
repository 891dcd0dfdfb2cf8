"""The judge: reference model, correctness gate, throughput benchmark, sandboxed judging
of one candidate file, and the speed-of-light model. Imports nothing from mutations/ or
evolve/."""
