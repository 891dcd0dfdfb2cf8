"""Measuring tools on top of the packages, sorted by who runs them.

Maintained measuring tools (python -m tools.NAME), each named by what it measures:
    gate_survival         a random walk from the seed: how many children pass the gate
    stack_vs_recipe       the stack a target's search would breed first, against a hand recipe
    operators_on_gpu      every operator's child of the seed judged on a GPU
    timed_run_overhead    where a judged run's time goes against the benchmark's clock
    judge_vs_evaluator    each program's ratio to a baseline, per case, judged and benched
    cheat_verdicts        every cheat of fitness/adversaries/cheats.py judged beside the seed
    judge_probe, judge_throughput   how fast and how precisely the judge judges
    engine_creation_cost  what making an engine costs beside running a case
    profile_case          where one case's time goes: wall, GPU busy time, kernels
    memory_peak           what is alive at a case's peak memory, and who allocated it
    transformers_bench    transformers itself on the large cases (the yardstick)
    matches_transformers  an engine file's logits against transformers' own model on a Hugging
                          Face checkpoint (on a GPU, with transformers' own bf16 as the yardstick)
    serve_offline, served_vs_offline, serve_greedy_check   the server against the engine alone,
                          and its greedy tokens against the reference
    served_vs_bound       a serve.bench report's levels beside the most their workload allows
    serve_timeline        N requests at once through the server, each step's time in its two
                          processes (the engine core's, the API's)
    bench_line, versus_recipe   `fitness bench` results as lines, and as ratios to the recipe's
                          per case (read by the GPU drivers)

GPU drivers (bash tools/gpu/NAME.sh OUT ...), one device call each:
    search                a search, its winner against the recipe, its judge
    targets               programs against the targets (check, compare, profile, memory, gate)
    judge_before_after    one judge against another on the same programs
    judge_vs_evaluator    the judge's ranking against the evaluator's (public library)
    serve, hf             the server, and Hugging Face shapes, on a GPU
    moe                   Qwen3-30B-A3B's shape (4 and 48 layers) on a 2-GPU host: the
                          hand-composed MoE program against the bound and transformers, served
    moe_batch1            Qwen3-30B-A3B's batch-1 step on one GPU, engine against engine: the
                          MoE GPU tests, each engine's step kernel by kernel, paired rounds
    moe_full48            Qwen3-30B-A3B's 48 layers on one GPU (drawn into a tmpfs): each
                          engine's steps against the bound, in the order given
    search_vs_recipe      a search on any target (one per GPU), then its winner against the
                          recipe, case by case
    hybrid                Qwen3.5-35B-A3B's shape on a 2-GPU host: the seed beside transformers eager
    hybrid_programs       the hybrid's programs swap by swap: gated, timed, profiled, served
    moe_knobs             the MoE kernels' knobs tuned on a family's sparse layer (Qwen3.5 or,
                          FAMILY=qwen3_moe, Qwen3-30B), then its hand recipe served with and
                          without them
    replicas              the server with one replica against one per GPU of the host, in turns
    hybrid_replicas       the hybrid's recipe served on a host: the hackathon's sweep with a
                          replica a GPU, one GPU at the same load, and the recipe against it with
                          one more allele or knob (under setsid, read with follow.sh)

Plumbing the drivers use (tools/gpu/):
    env.sh                sourced: the carried wheels installed, once
    bench_rounds.sh       sourced: two engines benched in turn, the order swapped every round
    queue.sh              jobs one after another on one GPU, in the background, outliving the call
    follow.sh             a later device call's view of work an earlier call started under setsid

The flags most of them share (--model-config and --weight-dir of the repository's toy model,
--device) come from tools/arguments.py.

Probes (python -m tools.probes.NAME): one-off measurements, each cited by the log it backs
(docs/log/), kept to re-measure; tools/probes/__init__.py lists them.

They judge what `mutations` makes with `fitness`, which is why they live here: the
operators themselves never import the judge.
"""
