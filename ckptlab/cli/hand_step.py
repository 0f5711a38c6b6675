"""The benchmark's baseline: one training step of models.MLP / models.GPT written by hand in
NumPy (or CuPy), forward and backward, with no engine, no graph and no checkpointing.

It does the same array work as the engine's "none" schedule (the same matmuls, the same
pointwise formulas, the same dropout masks drawn from the engine's RNG state), so the ratio of
the two step times is the engine's overhead. tests/test_bench_checkpoint.py checks that its
gradients equal the engine's.
"""

from __future__ import annotations

import math

from ckptlab import engine
from ckptlab.engine.arrays import xp_of
from ckptlab.engine.layers import keep_mask
from ckptlab.reference import causal_visible

GELU_C = math.sqrt(2.0 / math.pi)


class _Masks:
    """Dropout masks in the engine's order: one Philox offset per call with p > 0."""

    def __init__(self, p, xp):
        self.p, self.xp, self.scale = p, xp, 1.0 / (1.0 - p) if p else 1.0
        self.seed, self.offset = engine.rng_state()

    def draw(self, shape):
        if self.p == 0:
            return None
        self.offset += 1
        return keep_mask(self.seed, self.offset - 1, shape, self.p, self.xp)

    def apply(self, keep, a):
        return a if keep is None else self.xp.where(keep, a * self.scale, 0.0).astype(a.dtype)


def _cross_entropy(logits, t, xp):
    """loss and dlogits of the mean cross-entropy over rows."""
    C = logits.shape[-1]
    z = logits.reshape(-1, C)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    rows, t = xp.arange(z.shape[0]), t.reshape(-1)
    d = xp.exp(logp)
    d[rows, t] -= 1.0
    return -logp[rows, t].mean(), (d / z.shape[0]).reshape(logits.shape)


def mlp_step(m, x, y):
    """loss, {name: grad} of models.MLP by hand."""
    P = {k: t.data for k, t in m.params.items()}
    xp = xp_of(P["Wo"])
    x, drop = xp.asarray(x), _Masks(m.p, xp)
    xs, hs, keeps = [], [], []
    for i in range(m.layers):
        xs.append(x)
        h = xp.maximum(x @ P[f"{i}.W1"] + P[f"{i}.b1"], 0)  # (B, H)
        o = h @ P[f"{i}.W2"] + P[f"{i}.b2"]  # (B, D)
        keeps.append(drop.draw(o.shape))
        hs.append(h)
        x = x + drop.apply(keeps[-1], o)
    loss, d = _cross_entropy(x @ P["Wo"] + P["bo"], xp.asarray(y), xp)
    g = {"Wo": x.T @ d, "bo": d.sum(0)}
    dx = d @ P["Wo"].T
    for i in reversed(range(m.layers)):
        do = drop.apply(keeps[i], dx)
        g[f"{i}.W2"], g[f"{i}.b2"] = hs[i].T @ do, do.sum(0)
        dz = (do @ P[f"{i}.W2"].T) * (hs[i] > 0)
        g[f"{i}.W1"], g[f"{i}.b1"] = xs[i].T @ dz, dz.sum(0)
        if i > 0:  # the input is data: no gradient (the engine skips it too)
            dx = dx + dz @ P[f"{i}.W1"].T
    return loss, g


def _ln(x, w, b):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / (((xc * xc).mean(axis=-1, keepdims=True) + 1e-5) ** 0.5)
    xhat = xc * rstd
    return xhat * w + b, (xhat, rstd)


def _ln_back(g, w, cache, grads, name):
    xhat, rstd = cache
    lead = tuple(range(g.ndim - 1))
    grads[f"{name}.w"], grads[f"{name}.b"] = (g * xhat).sum(axis=lead), g.sum(axis=lead)
    dxhat = g * w
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                   - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


def _lin_back(g, x, W, grads, wname, bname):
    """dx of y = x W + b; dW and db into grads."""
    k, n = W.shape
    g2 = g.reshape(-1, n)
    grads[wname], grads[bname] = x.reshape(-1, k).T @ g2, g2.sum(axis=0)
    return g @ W.T


def gpt_step(m, tokens, targets):
    """loss, {name: grad} of models.GPT by hand (its attention impl: naive keeps P, flash
    keeps O and L and recomputes P in the backward)."""
    P = {k: t.data for k, t in m.params.items()}
    xp = xp_of(P["wte"])
    tokens, targets = xp.asarray(tokens), xp.asarray(targets)
    B, N = tokens.shape
    C, H = m.width, m.heads
    d, drop = C // H, _Masks(m.p, xp)
    allowed, scale = causal_visible(N, N, xp), 1.0 / math.sqrt(C // H)
    k_emb = drop.draw((B, N, C))
    x = drop.apply(k_emb, P["wte"][tokens] + P["wpe"][xp.arange(N)])
    caches = []
    for i in range(m.layers):
        c = {"x": x}
        h, c["ln1"] = _ln(x, P[f"{i}.ln1.w"], P[f"{i}.ln1.b"])
        c["h1"] = h
        q, k, v = ((h @ P[f"{i}.W{n}"] + P[f"{i}.b{n}"]).reshape(B, N, H, d).transpose(0, 2, 1, 3)
                   for n in "qkv")  # (B, H, N, d)
        S = xp.where(allowed, (q @ k.swapaxes(-1, -2)) * scale, -xp.inf)  # (B, H, N, N)
        mx = S.max(axis=-1, keepdims=True)
        E = xp.exp(S - mx)
        l = E.sum(axis=-1, keepdims=True)
        Pm = E / l
        c["keep_a"] = drop.draw(Pm.shape)
        O = drop.apply(c["keep_a"], Pm) @ v  # (B, H, N, d)
        c.update(q=q, k=k, v=v, P=Pm if m.attn == "naive" else None, O=O, L=mx + xp.log(l))
        a = O.transpose(0, 2, 1, 3).reshape(B, N, C)
        c["a"] = a
        c["keep_1"] = drop.draw((B, N, C))
        x = x + drop.apply(c["keep_1"], a @ P[f"{i}.Wo"] + P[f"{i}.bo"])
        c["x2"] = x
        h, c["ln2"] = _ln(x, P[f"{i}.ln2.w"], P[f"{i}.ln2.b"])
        c["h2"] = h
        f = h @ P[f"{i}.Wfc"] + P[f"{i}.bfc"]  # (B, N, 4C)
        t = xp.tanh(GELU_C * (f + 0.044715 * f * f * f))
        c["f"], c["gelu"] = f, 0.5 * f * (1.0 + t)
        c["keep_2"] = drop.draw((B, N, C))
        x = x + drop.apply(c["keep_2"], c["gelu"] @ P[f"{i}.Wproj"] + P[f"{i}.bproj"])
        caches.append(c)
    hf, lnf = _ln(x, P["lnf.w"], P["lnf.b"])
    loss, dlogits = _cross_entropy(hf @ P["W_head"], targets, xp)
    g = {"W_head": hf.reshape(-1, C).T @ dlogits.reshape(-1, m.vocab)}
    dx = _ln_back(dlogits @ P["W_head"].T, P["lnf.w"], lnf, g, "lnf")
    for i in reversed(range(m.layers)):
        c = caches[i]
        df = _lin_back(drop.apply(c["keep_2"], dx), c["gelu"], P[f"{i}.Wproj"], g,
                       f"{i}.Wproj", f"{i}.bproj")
        f = c["f"]
        t = xp.tanh(GELU_C * (f + 0.044715 * f * f * f))
        df = df * (0.5 * (1.0 + t)
                   + 0.5 * f * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * f * f))
        dh = _lin_back(df, c["h2"], P[f"{i}.Wfc"], g, f"{i}.Wfc", f"{i}.bfc")
        dx = dx + _ln_back(dh, P[f"{i}.ln2.w"], c["ln2"], g, f"{i}.ln2")
        da = _lin_back(drop.apply(c["keep_1"], dx), c["a"], P[f"{i}.Wo"], g, f"{i}.Wo", f"{i}.bo")
        dO = da.reshape(B, N, H, d).transpose(0, 2, 1, 3)
        q, k, v = c["q"], c["k"], c["v"]
        if c["P"] is not None:
            Pm = c["P"]
        else:  # flash: P = exp(S - L), recomputed
            Pm = xp.exp(xp.where(allowed, (q @ k.swapaxes(-1, -2)) * scale, -xp.inf) - c["L"])
        dv = drop.apply(c["keep_a"], Pm).swapaxes(-1, -2) @ dO
        dP = drop.apply(c["keep_a"], dO @ v.swapaxes(-1, -2))
        D = (dO * c["O"]).sum(-1, keepdims=True)
        dS = Pm * (dP - D)
        dq, dk = (dS @ k) * scale, (dS.swapaxes(-1, -2) @ q) * scale
        dh = 0
        for n, dt in (("q", dq), ("k", dk), ("v", dv)):
            dh = dh + _lin_back(dt.transpose(0, 2, 1, 3).reshape(B, N, C), c["h1"],
                                P[f"{i}.W{n}"], g, f"{i}.W{n}", f"{i}.b{n}")
        dx = dx + _ln_back(dh, P[f"{i}.ln1.w"], c["ln1"], g, f"{i}.ln1")
    dx = drop.apply(k_emb, dx)
    g["wte"] = xp.zeros_like(P["wte"])
    xp.add.at(g["wte"], tokens, dx)
    g["wpe"] = xp.zeros_like(P["wpe"])
    g["wpe"][:N] = dx.sum(axis=0)
    return loss, g


def hand_step(m, x, y):
    """One forward + backward of `m` by hand: (loss, grads)."""
    from ckptlab.models import GPT

    return gpt_step(m, x, y) if isinstance(m, GPT) else mlp_step(m, x, y)
