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

Every case uses the same thread count (default 2). Ratios are against transformers_hooks; the
effects of the float32 runs agree with the float64 ones (the largest difference is reported).

  python benchmarks/bench_effects.py [--out DIR] [--tokens 128] [--threads 2]

Writes effects.json to --out.
"""
from __future__ import annotations

import tempfile
import time

import numpy as np

import attngeom as ag
from attngeom.models import Ablate, head_ablation_effects, load_model
from harness import machine, parse, parser, write


def loss(logits: np.ndarray, ids: np.ndarray) -> float:
    z = np.asarray(logits, np.float64)[:-1]
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def main(argv=None):
    p = parser(__doc__, repeats=None, threads=True)
    p.add_argument("--tokens", type=int, default=128)
    args = parse(p, argv)
    import torch
    import transformers

    threads = ag.get_num_threads()
    torch.set_num_threads(threads)
    folder = tempfile.mkdtemp(prefix="bench_effects_")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(attn_implementation="sdpa")).eval()
    hf.save_pretrained(folder)
    model = load_model(folder)
    L, H, dh = model.arch.n_layers, model.arch.n_heads, model.arch.d_head
    ids = np.random.default_rng(0).integers(0, model.arch.vocab_size, args.tokens)
    rows = {}

    for dtype in (np.float64, np.float32):
        t0 = time.perf_counter()
        eff = head_ablation_effects(model, ids, mode="mean", dtype=dtype)
        rows[f"attngeom_{np.dtype(dtype).name}"] = {"seconds": time.perf_counter() - t0, "effects": eff}
    t0 = time.perf_counter()
    clean = model.forward(ids, keep=("logits", "z"))
    full = np.empty((L, H))
    for layer in range(L):
        for head in range(H):
            f = model.forward(ids, keep=("logits",), interventions=[Ablate("z", layer, heads=[head], mode="mean",
                                                                           reference=clean)])
            full[layer, head] = loss(f.logits, ids)
    rows["attngeom_full_passes"] = {"seconds": time.perf_counter() - t0}

    x = torch.tensor(ids)[None]
    t0 = time.perf_counter()
    with torch.inference_mode():
        means = {}

        def capture(layer):
            def pre(module, args):
                means[layer] = args[0][0].mean(0)  # (H dh,): every head's mean z over the tokens
            return pre

        handles = [hf.transformer.h[l].attn.c_proj.register_forward_pre_hook(capture(l)) for l in range(L)]
        base = loss(hf(x).logits[0].numpy(), ids)
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
                peer[layer, head] = loss(hf(x).logits[0].numpy(), ids) - base
                handle.remove()
    rows["transformers_hooks"] = {"seconds": time.perf_counter() - t0}

    anchor = rows["transformers_hooks"]["seconds"]
    e64, e32 = rows["attngeom_float64"]["effects"].effects, rows["attngeom_float32"]["effects"].effects
    summary = {name: {"seconds": r["seconds"], "ratio_to_transformers_hooks": r["seconds"] / anchor}
               for name, r in rows.items()}
    agreement = {"float32_vs_float64": float(np.abs(e32 - e64).max()),
                 "transformers_vs_float64": float(np.abs(peer - e64).max()),
                 "full_passes_vs_float32": float(np.abs(full - rows["attngeom_float32"]["effects"].baseline
                                                        - e32).max())}
    for name, r in summary.items():
        print(f"{name:24s} {r['seconds']:8.2f} s   ratio {r['ratio_to_transformers_hooks']:.2f}")
    print("largest effect differences:", {k: f"{v:.1e}" for k, v in agreement.items()})
    write(args.out, "effects", machine=machine(tokens=args.tokens, shape="gpt2-small (12 x 12, d 768)",
                                               transformers=transformers.__version__, torch=torch.__version__),
          cases=summary, agreement=agreement)


if __name__ == "__main__":
    main()
