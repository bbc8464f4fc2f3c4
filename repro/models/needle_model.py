"""A NemotronH (Mamba2 + attention) model with one MTP layer, in plain PyTorch, for training.

Its parameter names are those of published NemotronH checkpoints (``backbone.*``,
``lm_head``, ``mtp.layers.0.*``), so its state dict is the checkpoint vLLM loads, and its
arithmetic follows vLLM's NemotronH layers:
- pre-norm residual blocks (RMSNorm, then the mixer, added to the stream); a final ``norm_f``;
- the Mamba2 mixer: ``in_proj`` to [z, xBC, dt], a causal depthwise conv with SiLU over xBC,
  ``dt = softplus(dt + dt_bias)``, ``A = -exp(A_log)``, the selective scan (computed here in
  chunks, the state-space-duality form), ``+ D x``, a gated RMSNorm over the whole inner
  width (one group), ``out_proj``;
- attention with no positional encoding (NemotronH has none: order comes from the Mamba
  layers), grouped-query heads, scale head_dim^-1/2;
- the MTP layer vLLM builds for pattern "*": ``eh_proj([enorm(embed(x[t+1])); hnorm(h[t])])``,
  one attention block, ``final_layernorm``, the shared ``lm_head``; it predicts x[t+2] from the
  main model's final hidden state h[t] (after ``norm_f``, which is what vLLM hands the drafter).

`tests/test_needle_model.py` checks the main model against transformers' NemotronH on the same
weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x.to(dtype)) if dtype != torch.float32 else self.weight * x


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """Stable segment sums: out[..., i, j] = sum(x[..., j+1 : i+1]) for j <= i, else -inf."""
    t = x.size(-1)
    x = x[..., None].expand(*x.shape, t)
    below = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=-1)
    x = x.masked_fill(~below, 0)
    sums = torch.cumsum(x, dim=-2)
    keep = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=0)
    return sums.masked_fill(~keep, -torch.inf)


def ssd_scan(x, a, b, c, chunk: int):
    """h[t] = exp(a[t]) h[t-1] + b[t] x[t]^T;  y[t] = h[t] c[t].

    x: (batch, T, heads, p) already scaled by dt; a: (batch, T, heads) = dt * A;
    b, c: (batch, T, heads, n). T must be a multiple of `chunk`. Returns y like x.
    """
    batch, length, heads, p = x.shape
    chunks = length // chunk

    def split(t):
        return t.reshape(batch, chunks, chunk, *t.shape[2:])

    x, a, b, c = split(x), split(a), split(b), split(c)
    a = a.permute(0, 3, 1, 2)  # (batch, heads, chunks, chunk)
    a_cum = torch.cumsum(a, dim=-1)
    decay = torch.exp(_segsum(a))  # (batch, heads, chunks, l, s)
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, decay, x)
    decay_states = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay_states, x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum(F.pad(a_cum[..., -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, torch.exp(a_cum))
    return (y_diag + y_off).reshape(batch, length, heads, p)


class Mamba2Mixer(nn.Module):
    def __init__(self, r: dict) -> None:
        super().__init__()
        hidden, heads, hd = r["hidden_size"], r["mamba_num_heads"], r["mamba_head_dim"]
        self.heads, self.head_dim = heads, hd
        self.n_state, self.groups = r["ssm_state_size"], r["mamba_n_groups"]
        self.inner = heads * hd
        self.conv_dim = self.inner + 2 * self.groups * self.n_state
        self.d_conv = r["mamba_d_conv"]
        self.chunk = r["train_chunk"]
        self.in_proj = nn.Linear(hidden, self.inner + self.conv_dim + heads, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.d_conv, groups=self.conv_dim, bias=True
        )
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.D = nn.Parameter(torch.ones(heads))
        self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.norm = RMSNorm(self.inner, r["layer_norm_epsilon"])
        self.out_proj = nn.Linear(self.inner, hidden, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, length, _ = h.shape
        z, xbc, dt = self.in_proj(h).split([self.inner, self.conv_dim, self.heads], dim=-1)
        xbc = F.pad(xbc.transpose(1, 2), (self.d_conv - 1, 0))
        xbc = F.silu(self.conv1d(xbc)).transpose(1, 2)
        x, b, c = xbc.split(
            [self.inner, self.groups * self.n_state, self.groups * self.n_state], dim=-1
        )
        dt = F.softplus(dt.float() + self.dt_bias.float())
        a = -torch.exp(self.A_log.float())
        pad = (-length) % self.chunk
        x = x.reshape(batch, length, self.heads, self.head_dim).float()
        rep = self.heads // self.groups
        b = b.reshape(batch, length, self.groups, self.n_state).repeat_interleave(rep, 2).float()
        c = c.reshape(batch, length, self.groups, self.n_state).repeat_interleave(rep, 2).float()
        xs, adt = x * dt[..., None], dt * a
        if pad:
            xs, adt, b, c = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (xs, adt, b, c))
        y = ssd_scan(xs, adt, b, c, self.chunk)[:, :length]
        y = y + x * self.D.float()[:, None]
        y = y.reshape(batch, length, self.inner)
        y = y * F.silu(z.float())
        return self.out_proj(self.norm(y).to(h.dtype))


class Attention(nn.Module):
    def __init__(self, r: dict) -> None:
        super().__init__()
        hidden = r["hidden_size"]
        self.heads, self.kv_heads = r["num_attention_heads"], r["num_key_value_heads"]
        self.head_dim = r["head_dim"]
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, length, _ = h.shape

        def heads(t, n):
            return t.reshape(batch, length, n, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(h), self.heads)
        k = heads(self.k_proj(h), self.kv_heads)
        v = heads(self.v_proj(h), self.kv_heads)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    def __init__(self, r: dict, kind: str) -> None:
        super().__init__()
        self.norm = RMSNorm(r["hidden_size"], r["layer_norm_epsilon"])
        self.mixer = Mamba2Mixer(r) if kind == "M" else Attention(r)
        self.kind = kind
        # Set by the ablation check: a Mamba block whose mixer output is zeroed.
        self.silenced = False

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.mixer(self.norm(h))
        return h if self.silenced else h + out


class Backbone(nn.Module):
    def __init__(self, r: dict, vocab: int) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(vocab, r["hidden_size"])
        self.layers = nn.ModuleList(Block(r, k) for k in r["hybrid_override_pattern"])
        self.norm_f = RMSNorm(r["hidden_size"], r["layer_norm_epsilon"])


class MTPLayer(nn.Module):
    def __init__(self, r: dict) -> None:
        super().__init__()
        hidden, eps = r["hidden_size"], r["layer_norm_epsilon"]
        self.enorm = RMSNorm(hidden, eps)
        self.hnorm = RMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.norm = RMSNorm(hidden, eps)
        self.mixer = Attention(r)
        self.final_layernorm = RMSNorm(hidden, eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        h = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        h = h + self.mixer(self.norm(h))
        return self.final_layernorm(h)


class MTP(nn.Module):
    def __init__(self, r: dict) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({"0": MTPLayer(r)})


class NeedleNemotronH(nn.Module):
    def __init__(self, recipe: dict, vocab: int) -> None:
        super().__init__()
        if recipe["mtp_hybrid_override_pattern"] != "*":
            raise ValueError("the trainer builds one attention MTP layer (pattern '*') only")
        self.backbone = Backbone(recipe, vocab)
        self.lm_head = nn.Linear(recipe["hidden_size"], vocab, bias=False)
        self.mtp = MTP(recipe)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.backbone.embeddings(ids)
        for layer in self.backbone.layers:
            h = layer(h)
        return self.backbone.norm_f(h)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits for x[t+1] at every t, and the MTP layer's logits for x[t+2] at t < T-1."""
        h = self.hidden(ids)
        logits = self.lm_head(h)
        embeds = self.backbone.embeddings(ids[:, 1:])
        mtp_logits = self.lm_head(self.mtp.layers["0"](embeds, h[:, :-1]))
        return logits, mtp_logits

    def silence_mamba(self, silenced: bool = True) -> None:
        for layer in self.backbone.layers:
            if layer.kind == "M":
                layer.silenced = silenced


def initialise(model: NeedleNemotronH, recipe: dict, generator: torch.Generator) -> None:
    """Deterministic init: normal(0, std) linears and embeddings, Mamba2's dt and A ranges."""
    std = recipe["initializer_range"]
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "enorm.weight", "hnorm.weight", "norm_f.weight")) or (
            name.endswith("final_layernorm.weight")
        ):
            p.data.fill_(1.0)
        elif name.endswith("conv1d.bias"):
            p.data.zero_()
        elif name.endswith(".D"):
            p.data.fill_(1.0)
        elif name.endswith("A_log"):
            low, high = recipe["a_init_range"]
            u = torch.rand(p.shape, generator=generator)
            p.data.copy_(torch.log(low + (high - low) * u))
        elif name.endswith("dt_bias"):
            low, high = recipe["dt_init_range"]
            u = torch.rand(p.shape, generator=generator)
            dt = torch.exp(math.log(low) + (math.log(high) - math.log(low)) * u)
            p.data.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        elif name.endswith("conv1d.weight"):
            bound = 1 / math.sqrt(recipe["mamba_d_conv"])
            p.data.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
        else:
            p.data.copy_(torch.randn(p.shape, generator=generator) * std)
        if name.endswith(("out_proj.weight", "o_proj.weight")):
            # GPT-2-style scaling of residual-branch outputs by depth.
            p.data /= math.sqrt(2 * len(recipe["hybrid_override_pattern"]))
