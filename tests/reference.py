"""Plain-NumPy references written from the papers' formulas, for testing the C++ kernels.

Everything here is deliberately direct: full n_q x n_k matrices, float64 (or longdouble
where it matters), no blocking.
"""
from __future__ import annotations

import math

import numpy as np


def causal_keep(n_q, n_k, causal):
    """Boolean (n_q, n_k): key j visible to query i."""
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    if causal in (False, None):
        return np.ones((n_q, n_k), bool)
    if causal in (True, "top_left"):
        return j <= i
    if causal == "bottom_right":
        return j <= i + (n_k - n_q)
    raise ValueError(causal)


def normalise(logw, keep):
    """Row-normalised exp(logw) over the visible entries; rows with none visible are 0."""
    logw = np.where(keep, logw, -np.inf)
    m = np.max(logw, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(logw - m)
    s = w.sum(-1, keepdims=True)
    p = np.divide(w, s, out=np.zeros_like(w), where=s > 0)
    with np.errstate(divide="ignore"):
        log_z = np.where(s[..., 0] > 0, m[..., 0] + np.log(s[..., 0]), -np.inf)
    return p, log_z


def apply_mask(logw, keep, mask):
    if mask is None:
        return logw, keep
    mask = np.asarray(mask)
    if mask.dtype == bool:
        return logw, keep & mask
    return logw + mask, keep


def softmax_attention(q, k, v, mask=None, causal=False, scale=None):
    """Laplace-Radon eq. (2)-(3) with a mask; returns (y, P, log Z)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = scale * q @ np.swapaxes(k, -1, -2)
    keep = np.broadcast_to(causal_keep(q.shape[-2], k.shape[-2], causal), logits.shape)
    logits, keep = apply_mask(logits, keep, mask)
    p, log_z = normalise(logits, keep)
    return p @ v, p, log_z


def tilt_radius(q, scale=None):
    q = np.asarray(q, np.float64)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    r = np.sqrt((q**2).sum(-1))
    u = q / np.where(r > 0, r, 1)[..., None]  # a zero query keeps u = 0
    return u, r * scale


def log_psi(kernel, tau, s, **p):
    """log psi(tau, s) from the paper's formulas (eq. 53, 54, 56, 57)."""
    if kernel == "exp":
        return tau * s
    if kernel == "gaussian":
        return -((tau - s) ** 2) / (2 * p.get("sigma", 1.0) ** 2)
    if kernel == "cauchy":
        return -np.log1p(((tau - s) / p.get("gamma", 1.0)) ** 2)
    if kernel == "stable":
        # the density itself is validated in test_stable_density against integration and
        # series; here it is the attention around it that is under test
        import attngeom

        return attngeom.stable_density(tau - s, p.get("alpha", 1.5), p.get("c", 1.0), log=True)
    raise ValueError(kernel)


def ridge_attention(u, tau, k, v, kernel="exp", mask=None, causal=False, **p):
    """Generalized attention y = N_psi / Z_psi (eq. 40-44); returns (y, P, log Z)."""
    u, k, v = (np.asarray(a, np.float64) for a in (u, k, v))
    tau = np.asarray(tau, np.float64)
    s = u @ np.swapaxes(k, -1, -2)
    logw = log_psi(kernel, tau[..., None], s, **p)
    keep = np.broadcast_to(causal_keep(u.shape[-2], k.shape[-2], causal), logw.shape)
    logw, keep = apply_mask(logw, keep, mask)
    p_, log_z = normalise(logw, keep)
    return p_ @ v, p_, log_z


def transform(u, tau, k, v=None):
    """Z and N by direct summation of exp(tau s) (eq. 11-13, 34), complex tau allowed."""
    s = np.asarray(u, np.float64) @ np.swapaxes(np.asarray(k, np.float64), -1, -2)
    w = np.exp(np.asarray(tau)[..., None] * s)
    Z = w.sum(-1)
    N = None if v is None else w @ np.asarray(v, np.float64)
    return Z, N


def cumulants(u, tau, k, order, kernel="exp", **p):
    """Gibbs cumulants of S = u.k, from explicit weights, in extended precision."""
    u, k = np.asarray(u, np.longdouble), np.asarray(k, np.longdouble)
    s = u @ np.swapaxes(k, -1, -2)
    logw = log_psi(kernel, np.asarray(tau, np.longdouble)[..., None], s, **p)
    w = np.exp(logw - logw.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    mean = (w * s).sum(-1)
    c = s - mean[..., None]
    mu = [None, None] + [(w * c**m).sum(-1) for m in (2, 3, 4)]
    out = [mean, mu[2], mu[3], mu[4] - 3 * mu[2] ** 2]
    return np.stack(out[:order], -1).astype(np.float64)


def stable_density(x, alpha, c=1.0):
    """Symmetric alpha-stable density by direct numerical integration,
    f(x) = (1/pi) int_0^inf exp(-c w^alpha) cos(w x) dw (scipy QAWO on [0, W] with
    exp(-c W^alpha) = e^-60), for alpha >= 0.9 and |x| <= 30 (beyond, the integral's
    round-off exceeds the density)."""
    from scipy import integrate

    if alpha < 0.9:
        raise ValueError("the Fourier integral converges too slowly for alpha < 0.9; use stable_tail_series")
    x = np.abs(np.atleast_1d(np.asarray(x, np.float64)))
    W = (60.0 / c) ** (1 / alpha)
    f = lambda w: math.exp(-c * w**alpha)
    out = [integrate.quad(f, 0, W, weight="cos", wvar=xi, epsabs=0, epsrel=1e-13, limit=2000)[0] / math.pi
           for xi in x.ravel()]
    return np.array(out).reshape(x.shape)


def stable_tail_series(x, alpha):
    """f_1(x) = (1/pi) sum_k (-1)^(k+1) Gamma(alpha k + 1) / k! sin(k pi alpha / 2) x^-(alpha k + 1),
    convergent for alpha < 1, summed in extended precision (c = 1); NaN where the sum
    cancels more than two digits (small x; the terms carry float64 lgamma)."""
    out = []
    with np.errstate(over="ignore", invalid="ignore"):
        for xi in np.abs(np.atleast_1d(np.asarray(x, np.float64))).ravel():
            total = np.longdouble(0)
            biggest, converged = 0.0, False
            log_x = np.log(np.longdouble(xi))
            for k in range(1, 5000):
                mag = np.exp(np.longdouble(math.lgamma(alpha * k + 1) - math.lgamma(k + 1)) - (alpha * k + 1) * log_x)
                total += (-1) ** (k + 1) * mag * np.sin(np.longdouble(k * math.pi * alpha / 2))
                biggest = max(biggest, float(mag))
                if mag < 1e-19 * abs(total):
                    converged = True
                    break
            good = converged and biggest < 1e2 * abs(float(total))
            out.append(float(total / np.longdouble(math.pi)) if good else np.nan)
    return np.array(out)


# -- spectral (Laplace-Radon s.5-6, s.12, app. B; notes "spectral diagnostics") ------------
def null_space(M, rtol=None):
    """ker(M) by a full SVD (column basis) and the matrix_rank rule."""
    M = np.asarray(M, dtype=np.float64)
    _, s, vh = np.linalg.svd(M, full_matrices=True)
    if rtol is None:
        rtol = max(M.shape) * np.finfo(np.float64).eps
    rank = int(np.sum(s > rtol * s[0])) if s.size else 0
    return vh[rank:].T, rank


def effective_rank(s, kind):
    """The three effective ranks from their definitions."""
    s = np.asarray(s, dtype=np.float64)
    if kind == "participation":
        return float((s ** 2).sum() ** 2 / (s ** 4).sum())
    w = s if kind == "entropy" else s ** 2
    p = w[w > 0] / w.sum()
    return float(math.exp(-(p * np.log(p)).sum()))


def tilt_eigenvalues(u, centered=False):
    """Eigenvalues (descending) of E[u u^T] (or Cov(u)) of the normalised nonzero rows of u."""
    u = np.asarray(u, dtype=np.float64).reshape(-1, np.shape(u)[-1])
    norm = np.linalg.norm(u, axis=1)
    u = u[norm > 0] / norm[norm > 0, None]
    c = u.T @ u / len(u)
    if centered:
        m = u.mean(0)
        c = c - np.outer(m, m)
    return np.linalg.eigvalsh(c)[::-1]


# -- lightning (Henry-Marchetti-Kohn eq. 1-2, 16) and projection (Sanger) -----------------
def lightning_attention(q, k, v, causal=False):
    """y_i = sum_j (q_i . k_j) v_j over the visible keys, quadratic."""
    s = q @ np.swapaxes(k, -1, -2)
    return (s * causal_keep(q.shape[-2], k.shape[-2], causal)) @ v


def lightning_layer_columns(X, A, V):
    """The paper's eq. (2) literally, tokens as columns: phi(X) = V X X^T A X, X (d, t)."""
    return V @ X @ X.T @ A @ X


def normalized_layer_columns(X, A, V, temperature=1.0):
    """Eq. (16) literally, tokens as columns: (1/zeta_i) sum_j exp(x_i^T A x_j / T) V x_j."""
    t = X.shape[1]
    out = np.zeros((V.shape[0], t))
    for i in range(t):
        w = np.array([math.exp(X[:, i] @ A @ X[:, j] / temperature) for j in range(t)])
        out[:, i] = (V @ X) @ w / w.sum()
    return out


def projection_weights(q, k, sigma):
    """z_ij = exp(-|q_i - k_j|^2 / (2 sigma^2)) / sum_j ..., from explicit distances."""
    d2 = np.sum((q[..., :, None, :] - k[..., None, :, :]) ** 2, axis=-1)
    logw = -d2 / (2 * sigma ** 2)
    return normalise(logw, np.ones(d2.shape[-2:], bool))[0]


# -- whitening ("Whitened Self-Attention" eq. 3, 7-9, 10-14) --------------------------------
def block_bidiagonal_solve(x, Ls, Ms):
    """W = L_full^{-1} X with the explicit (T D x T D) block-bidiagonal matrix; x (B, T, D),
    Ls, Ms (T, D, D) (M_0 unused)."""
    B, T, D = x.shape
    full = np.zeros((T * D, T * D))
    for i in range(T):
        full[i * D:(i + 1) * D, i * D:(i + 1) * D] = Ls[i]
        if i:
            full[i * D:(i + 1) * D, (i - 1) * D:i * D] = Ms[i]
    return np.linalg.solve(full, x.reshape(B, T * D).T).T.reshape(B, T, D)


def whiteness(x):
    B, T, D = x.shape
    X = x.reshape(B, T * D)
    lam = np.abs(np.cov(X, rowvar=False, ddof=1))
    n = T * D
    off = lam.sum() - np.trace(lam)
    return off / (n - 1) / np.trace(lam)


# -- inverse Laplace (Laplace-Radon eq. 36): matrix pencil, plain NumPy --------------------
def matrix_pencil(f, L, M):
    """Nodes z of f_k = sum_m c_m z_m^k from one Hankel matrix (Hua-Sarkar), order M given:
    the eigenvalues of pinv(Y1) Y2 restricted to the rank-M signal subspace."""
    N = len(f)
    Y = np.array([f[i:i + L + 1] for i in range(N - L)])
    _, _, vh = np.linalg.svd(Y, full_matrices=False)
    W = vh[:M].T  # (L + 1, M): the rows of Y = U S Vh lie in the span of the rows of Vh
    F = np.linalg.pinv(W[:-1]) @ W[1:]
    return np.linalg.eigvals(F)


def favor_attention(q, k, v, W, scale):
    """FAVOR+ written out: phi(x) = exp(W x - |x|^2/2) / sqrt(m) of sqrt(scale) q and k, y = N/Z."""
    root = math.sqrt(scale)

    def phi(x):
        x = x * root
        return np.exp(x @ W.T - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(W.shape[0])

    fq, fk = phi(q), phi(k)
    num = fq @ (np.swapaxes(fk, -1, -2) @ v)
    den = fq @ fk.sum(-2)[..., None]
    return num / den


def favor_log_domain(q, k, v, W, scale, causal=False):
    """FAVOR+ (y, log Z) in the log domain, no shift to choose: every term exp(l_q,f + l_k,f) of
    Z_i = sum_{j visible, f} phi_f(q_i) phi_f(k_j) is summed by logsumexp, so the estimate is
    exact to rounding for any logits. q (n_q, d), k (n_k, d), v (n_k, d_v), one head; a query
    that sees no key gets y = 0, log Z = -inf."""
    root, m = math.sqrt(scale), W.shape[0]

    def logits(x):
        x = x * root
        return x @ W.T - 0.5 * np.sum(x * x, -1, keepdims=True)

    t = logits(q)[:, None, :] + logits(k)[None, :, :]  # (n_q, n_k, m)
    keep = causal_keep(q.shape[0], k.shape[0], causal)
    t = np.where(keep[:, :, None], t, -np.inf)
    top = t.max(axis=(1, 2))
    safe = np.where(np.isfinite(top), top, 0.0)
    w = np.exp(t - safe[:, None, None]).sum(-1)  # (n_q, n_k), relative to exp(top)
    den = w.sum(-1)
    with np.errstate(divide="ignore"):
        log_z = np.where(den > 0, np.log(den) + safe - math.log(m), -np.inf)
    y = np.divide(w @ v, den[:, None], out=np.zeros((q.shape[0], v.shape[1])), where=den[:, None] > 0)
    return y, log_z


def favor_log_domain_grads(q, k, v, dy, W, scale, causal=False):
    """Cotangents (dq, dk, dv) of the FAVOR+ estimate (favor_log_domain) for dy, one head, in
    the log domain: every term e_ijf = exp(l_q,if + l_k,jf - top_i) <= 1 is formed, so they are
    exact to rounding for any logits. With c_ij = dy_i.v_j - dy_i.y_i and den_i = sum_jf e_ijf:
    dl_q,if = sum_j e_ijf c_ij / den_i, dl_k,jf = sum_i e_ijf c_ij / den_i, dv_j = sum_i
    (sum_f e_ijf / den_i) dy_i; through the logits l = W x' - |x'|^2 / 2 with x' = sqrt(scale) x.
    Queries that see no key pass no gradient."""
    root = math.sqrt(scale)

    def logits(x):
        x = x * root
        return x @ W.T - 0.5 * np.sum(x * x, -1, keepdims=True)

    t = logits(q)[:, None, :] + logits(k)[None, :, :]
    keep = causal_keep(q.shape[0], k.shape[0], causal)
    t = np.where(keep[:, :, None], t, -np.inf)
    top = t.max(axis=(1, 2))
    live = np.isfinite(top)
    e = np.exp(t - np.where(live, top, 0.0)[:, None, None])  # (n_q, n_k, m)
    den = np.where(live, e.sum(axis=(1, 2)), 1.0)
    w = e.sum(-1) / den[:, None]
    y = w @ v
    c = (dy @ v.T - np.sum(dy * y, -1, keepdims=True)) / den[:, None]  # c_ij / den_i
    dlq = np.einsum("ijf,ij->if", e, c)
    dlk = np.einsum("ijf,ij->jf", e, c)

    def through(dl, x):
        return root * (dl @ W - (root * x) * dl.sum(-1, keepdims=True))

    return through(dlq, q), through(dlk, k), w.T @ dy


def favor_materialised(q, k, v, m, seed, scale, causal):
    """FAVOR+ (y, log Z) through the (n, m) feature matrices of the public API: per-row
    shifted query features, key features shifted by one maximum over the whole block, and
    lightning attention on [v, 1]. A shift that large underflows the keys an early causal
    query sees when the key norms fall along the sequence."""
    import attngeom as ag

    root = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    fq = ag.random_features(q * q.dtype.type(root), m, seed=seed, per_row=True)
    fk = ag.random_features(k * k.dtype.type(root), m, seed=seed, per_row=False)
    values = np.concatenate([v, np.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    out = ag.lightning_attention(fq.phi, fk.phi, values, causal=causal)
    num, den = out[..., :-1], out[..., -1]
    y = np.divide(num, den[..., None], out=np.zeros_like(num), where=den[..., None] > 0)
    with np.errstate(divide="ignore"):
        log_z = np.log(den) + fq.log_shift + fk.log_shift[..., :1]
    return y, log_z


def vector_ar1_steps(Phi, B, T, seed, burn_in):
    """x_i = Phi_i x_{i-1} + e_i simulated step by step (Phi (D, D) or (T, D, D))."""
    rng = np.random.default_rng(seed)
    D = Phi.shape[-1]
    x = np.zeros((B, D))
    first = Phi if Phi.ndim == 2 else Phi[0]
    for _ in range(burn_in):
        x = x @ first.T + rng.standard_normal((B, D))
    out = np.empty((B, T, D))
    for t in range(T):
        x = x @ (Phi if Phi.ndim == 2 else Phi[t]).T + rng.standard_normal((B, D))
        out[:, t] = x
    return out


def decoder_logits(tensors, config, ids, rows=None, block=512):
    """The logits of a Llama-family decoder (Llama, Mistral without its window, Qwen2, Qwen3;
    default rotary) written out from the architecture in float64: RMSNorm, rotate-half RoPE
    (Qwen3: per-head RMSNorm of q and k first), grouped-query causal softmax attention, a
    SiLU-gated MLP, tied or separate unembedding.

    tensors are the checkpoint's {name: array} (transformers' names, Linear weights (out, in)),
    config its config.json dict, ids (n,) one sequence. The last layer runs only the query rows
    `rows` (default: the last token), so the logits at those rows are (len(rows), vocab). The
    attention of the other layers runs its query rows in blocks of `block` (the one departure
    from this module's no-blocking rule: a 16k-token sequence's (H, n, n) weights would not fit).
    """
    c = config
    assert c.get("rope_parameters", {"rope_type": "default"})["rope_type"] == "default"
    assert not c.get("sliding_window") or c["model_type"] != "mistral" or len(ids) <= c["sliding_window"]
    W = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    d, L, H, K = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
    dh = c.get("head_dim") or d // H
    eps, n = c["rms_norm_eps"], len(ids)
    rows = np.array([n - 1] if rows is None else rows)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    theta = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0))
    angle = np.arange(n)[:, None] * theta ** (-np.arange(0, dh, 2) / dh)
    cos, sin = np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle, angle], -1))

    def rotate(t, at):  # t (heads, len(at), dh) at positions at
        half = dh // 2
        return t * cos[at] + np.concatenate([-t[..., half:], t[..., :half]], -1) * sin[at]

    x = W["model.embed_tokens.weight"][ids]
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        at = rows if i == L - 1 else np.arange(n)  # the query rows this layer needs
        h = rms(x, W[p + "input_layernorm.weight"])

        def project(role, heads, r):
            y = h[r] @ W[a + f"{role}_proj.weight"].T + W.get(a + f"{role}_proj.bias", 0)
            y = y.reshape(len(r), heads, dh).transpose(1, 0, 2)
            return rms(y, W[a + f"{role}_norm.weight"]) if a + f"{role}_norm.weight" in W else y

        q = rotate(project("q", H, at), at)
        k = rotate(project("k", K, np.arange(n)), np.arange(n))
        v = project("v", K, np.arange(n))
        k, v = np.repeat(k, H // K, axis=0), np.repeat(v, H // K, axis=0)
        z = np.empty((H, len(at), dh))
        for lo in range(0, len(at), block):
            s = q[:, lo:lo + block] @ k.transpose(0, 2, 1) / math.sqrt(dh)
            s = np.where(np.arange(n)[None, None, :] <= at[lo:lo + block, None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            z[:, lo:lo + block] = (s / s.sum(-1, keepdims=True)) @ v
        x = x[at] + z.transpose(1, 0, 2).reshape(len(at), H * dh) @ W[a + "o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        gate = h @ W[p + "mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    return x @ W.get("lm_head.weight", W["model.embed_tokens.weight"]).T
