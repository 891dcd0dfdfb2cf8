"""The search: a DEAP loop over engine programs, judged by fitness/, bred by mutations/."""
