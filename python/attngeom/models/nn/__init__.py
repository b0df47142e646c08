"""The one transformer of :mod:`attngeom.models`: the forward pass of every family (decoders
and the BERT encoder) with its norms, rotary embedding, multi-head latent attention, mixture
of experts and interventions, the per-head weights, and adapters from models in memory. It
imports :mod:`..io` only.
"""
