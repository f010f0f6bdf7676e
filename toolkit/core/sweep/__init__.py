"""Sweeps: vary knobs of a profile, measure every variant, rank them, promote the best.

variants: `--vary` into validated variants; state: the resumable record; run: the loop over an injected
runner; ranking: throughput, tokens per joule, Pareto front; recorded: an in-process runner over a
table of recorded results; promote: the promoted profile's text.
"""
