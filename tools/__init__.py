"""Measuring tools on top of the packages, run by hand or on the GPU machine.

    python -m tools.walk        a random walk from the seed: how many children pass the gate
    python -m tools.gpu_check   every operator's child of the seed judged on a GPU
    python -m tools.go_overhead where a judged run's time goes against the benchmark's clock
    python -m tools.judge_vs_evaluator   each program's ratio to a baseline, per case, judged and benched
    python -m tools.cheat_verdicts   every cheat of fitness/adversaries/cheats.py judged beside the seed
    python -m tools.judge_probe, judge_throughput   how fast and how precisely the judge judges
    python -m tools.create_probe     what making an engine costs beside running a case
    python -m tools.profile_case     where one case's time goes: wall, GPU busy time, kernels
    python -m tools.memory_peak      what is alive at a case's peak memory, and who allocated it
    python -m tools.transformers_bench   transformers itself on the large cases (the yardstick)
    python -m tools.matches_transformers   an engine file's logits against transformers' own model
                                on a Hugging Face checkpoint (a search's winner; on a GPU, with
                                transformers' own bf16 as the yardstick)
    python -m tools.serve_offline, served_vs_offline, serve_greedy_check   the server against
                                the engine alone, and its greedy tokens against the reference
    python -m tools.serve_timeline   N requests at once through the server, and each step's
                                time in its two processes (the engine core's, the API's)
    python -m tools.bench_line, versus_recipe   `fitness bench` results as lines, and as
                                ratios to the recipe's per case (read by the gpu_*.sh drivers)
    bash tools/gpu_search.sh    one device call each: a search, its winner against the recipe, its judge
    bash tools/gpu_targets.sh   one device call each: programs against the targets (check, compare,
                                profile, memory, gate)
    bash tools/gpu_judge_before_after.sh   one judge against another on the same programs
    bash tools/gpu_judge_vs_evaluator.sh   the judge's ranking against the evaluator's (public library)
    bash tools/gpu_serve.sh, gpu_hf.sh     the server, and Hugging Face shapes, on a GPU
    bash tools/gpu_moe.sh       Qwen3-30B-A3B's shape (4 and 48 layers) on a 2-GPU host: the
                                hand-composed MoE program against the bound and transformers, served
    bash tools/gpu_search_vs_recipe.sh     a search on any target (one per GPU), then its winner
                                against the recipe, case by case
    bash tools/gpu_queue.sh     jobs (searches, comparisons, the server, HF shapes) one after
                                another on one GPU, in the background, outliving the call
    bash tools/gpu_follow.sh    a later device call's view of work an earlier call started under
                                setsid: stops at once on a fresh machine, brings back what exists
    tools/gpu_env.sh            sourced by the drivers: the carried wheels installed, once
    tools/bench_rounds.sh       sourced by the drivers: two engines benched in turn, the order
                                swapped every round
    tools/probes/               one-off measurements cited in docs/PERF.md, kept to re-measure

They judge what `mutations` makes with `fitness`, which is why they live here: the
operators themselves never import the judge.
"""
