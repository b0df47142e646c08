"""Analyses of real models in :mod:`attngeom.models`: logit lens, induction scores, weight
spectra, latent rank of the key cache, router statistics, the per-head report, token
activations for the diagnostics, causal effects, and the prompts and planted models they
run on. It imports :mod:`..io` and :mod:`..nn`.
"""
