"""Head ablation effects on a GPT-2-small-shaped checkpoint: attngeom against the peer way.

A random-init checkpoint with GPT-2 small's shapes (12 layers x 12 heads, d_model 768,
vocabulary 50,257; float32 on disk) is written by ``transformers`` (save_pretrained). On one
sequence of 128 random tokens this times:

* ``attngeom``: ``head_ablation_effects(model, ids, mode="mean")`` (the 144 mean ablations of
  each head's z and the loss), float64 (its default) and float32. The clean pass runs once and
  each ablation restarts from the clean residual stream entering its layer, so an ablation in
  layer l costs layers l..11 only (78 layer passes per head on average, not 144 x 12);
* ``attngeom_full_passes``: the same ablations as whole forward passes (``Model.forward`` with
  an ``Ablate``), float32: what the reuse saves;
* ``transformers_hooks``: the peer way (TransformerLens and hand-written hooks do this): 144
  forwards of transformers' GPT-2 (sdpa, float32, ``torch.inference_mode``), each with a
  forward pre-hook on the layer's c_proj writing the head's mean z.

Every case uses the same thread count, attngeom's and torch's (--threads, default 2; printed),
and is the median of --repeats calls (default 3) after a warm-up. Ratios are against
transformers_hooks.

Gates (harness.agree, relative to the anchor's largest entry; the exit status is 1 beyond a
tolerance): the clean pass's logits against transformers' (float32, 1e-4: measured about
1e-6); the 144 effects (loss changes) of the float64 run against transformers' hooks (1e-3:
transformers' float32 losses differ from float64 by about 1e-5 of the largest effect), of
the float32 run against the float64 one (1e-3, the same rounding) and of the full passes
against the float32 run (1e-3: two float32 paths to one number). A wrong head or site moves
an effect by its own size. --quick: a 4-layer, 4-head, d_model 128 model on 32 tokens.

  python benchmarks/bench_effects.py [--out DIR] [--tokens 128] [--threads 2] [--repeats R] [--quick]

Writes effects.json to --out.
"""
from __future__ import annotations

import sys
import tempfile

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import timed
from attngeom.models import Ablate, head_ablation_effects, load_model
from harness import agree, finish, machine, parse, parser, print_threads

LOGIT_TOLERANCE = 1e-4   # the clean logits against transformers', relative; see the docstring
EFFECT_TOLERANCE = 1e-3  # effects against each other, relative to the largest effect


def loss(logits: np.ndarray, ids: np.ndarray) -> float:
    z = np.asarray(logits, np.float64)[:-1]
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def full_passes(model, ids):
    """The loss of every head's mean ablation, each as a whole forward pass (float32)."""
    L, H = model.arch.n_layers, model.arch.n_heads
    clean = model.forward(ids, keep=("logits", "z"))
    full = np.empty((L, H))
    for layer in range(L):
        for head in range(H):
            f = model.forward(ids, keep=("logits",), interventions=[Ablate("z", layer, heads=[head], mode="mean",
                                                                           reference=clean)])
            full[layer, head] = loss(f.logits, ids)
    return full


def transformers_hooks(hf, ids, L, H, dh):
    """The peer way: each head's mean ablation as a forward of transformers' model with a
    pre-hook on the layer's c_proj; (the clean logits, the effects (L, H))."""
    import torch

    x = torch.tensor(ids)[None]
    with torch.inference_mode():
        means = {}

        def capture(layer):
            def pre(module, args):
                means[layer] = args[0][0].mean(0)  # (H dh,): every head's mean z over the tokens
            return pre

        handles = [hf.transformer.h[l].attn.c_proj.register_forward_pre_hook(capture(l)) for l in range(L)]
        logits = hf(x, use_cache=False).logits[0].numpy()
        base = loss(logits, ids)
        for handle in handles:
            handle.remove()
        peer = np.empty((L, H))
        for layer in range(L):
            for head in range(H):
                cols = slice(head * dh, (head + 1) * dh)

                def pre(module, args, cols=cols, layer=layer):
                    z = args[0].clone()
                    z[..., cols] = means[layer][cols]
                    return (z,)

                handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(pre)
                peer[layer, head] = loss(hf(x, use_cache=False).logits[0].numpy(), ids) - base
                handle.remove()
    return logits, peer


def main(argv=None):
    p = parser(__doc__, threads=True, default_threads=2)
    p.add_argument("--tokens", type=int, default=128)
    args = parse(p, argv)
    import torch
    import transformers

    torch.set_num_threads(ag.get_num_threads())
    threads = print_threads()
    with tempfile.TemporaryDirectory(prefix="bench_effects_") as folder:
        return run(args, folder, threads)


def run(args, folder, threads):
    """The benchmark on a checkpoint written to `folder`; the exit status."""
    import torch
    import transformers

    tokens = 32 if args.quick else args.tokens
    shape = dict(n_layer=4, n_head=4, n_embd=128) if args.quick else {}
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(attn_implementation="sdpa", **shape)).eval()
    hf.save_pretrained(folder)
    model = load_model(folder)
    L, H, dh = model.arch.n_layers, model.arch.n_heads, model.arch.d_head
    ids = np.random.default_rng(0).integers(0, model.arch.vocab_size, tokens)
    r = args.repeats
    print(f"{L} x {H} heads, d_model {model.arch.d_model}, {tokens} tokens; medians of {r} calls after a warm-up")
    rows = {}
    for dtype in (np.float64, np.float32):
        eff, t = timed(lambda: head_ablation_effects(model, ids, mode="mean", dtype=dtype), r, warm_up=True)
        rows[f"attngeom_{np.dtype(dtype).name}"] = {"seconds": t, "effects": eff}
    full, t = timed(lambda: full_passes(model, ids), r, warm_up=True)
    rows["attngeom_full_passes"] = {"seconds": t}
    (hf_logits, peer), t = timed(lambda: transformers_hooks(hf, ids, L, H, dh), r, warm_up=True)
    rows["transformers_hooks"] = {"seconds": t}

    anchor = rows["transformers_hooks"]["seconds"]
    e64, e32 = rows["attngeom_float64"]["effects"].effects, rows["attngeom_float32"]["effects"].effects
    summary = {name: {"seconds": r["seconds"], "ratio_to_transformers_hooks": r["seconds"] / anchor}
               for name, r in rows.items()}
    for name, r in summary.items():
        print(f"{name:24s} {r['seconds']:8.2f} s   ratio {r['ratio_to_transformers_hooks']:.2f}")
    checks = [agree("clean logits, attngeom float32 vs transformers", model.forward(ids, keep=("logits",)).logits,
                    hf_logits, rtol=LOGIT_TOLERANCE),
              agree("effects, attngeom float64 vs transformers hooks", e64, peer, rtol=EFFECT_TOLERANCE),
              agree("effects, attngeom float32 vs float64", e32, e64, rtol=EFFECT_TOLERANCE),
              agree("effects, full passes vs attngeom float32", full - rows["attngeom_float32"]["effects"].baseline,
                    e32, rtol=EFFECT_TOLERANCE)]
    return finish(args.out, "effects", meta=machine(tokens=tokens, shape=f"gpt2 ({L} x {H}, d {model.arch.d_model})",
                                                   repeats=r, transformers=transformers.__version__,
                                                   torch=torch.__version__),
                  threads=threads, cases=summary, agreement_summary={c["case"]: c["max_rel_error"] for c in checks})


if __name__ == "__main__":
    sys.exit(main())
