"""flash_attn.layers.rotary: rotary position embeddings (RoPE) in PyTorch, flash-attn's conventions.
cos and sin are (seqlen_ro, rotary_dim / 2); the first rotary_dim features of each head are rotated,
either as halves (GPT-NeoX, interleaved=False) or as adjacent pairs (GPT-J, interleaved=True)."""
import torch


def _rotate(x, cos, sin, interleaved):
    rot = cos.shape[-1] * 2
    # In f32 at least (f64 stays f64), rounded to x's dtype once at the end, as flash-attn's kernel and attn's
    # own rotary in flash_attn_with_kvcache compute it: rounding cos, sin, each product and their difference
    # to bf16 or f16 lands several units in the last place away from those where the products cancel.
    acc = torch.promote_types(x.dtype, torch.float32)
    x_rot, x_pass = x[..., :rot].to(acc), x[..., rot:]
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2:]
    c, s = cos.to(acc), sin.to(acc)
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    y = torch.stack((y1, y2), dim=-1).flatten(-2) if interleaved else torch.cat((y1, y2), dim=-1)
    return torch.cat((y.to(x.dtype), x_pass), dim=-1)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens; position p of a
    sequence uses row p + seqlen_offsets of cos/sin (seqlen_offsets an int or a (batch,) tensor)."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        offsets = torch.as_tensor(seqlen_offsets).reshape(-1, 1) if torch.is_tensor(seqlen_offsets) else seqlen_offsets
        pos = torch.arange(seqlen).reshape(1, -1) + offsets
        pos = pos.expand(batch, seqlen)
        out = _rotate(x, cos[pos][:, :, None], sin[pos][:, :, None], interleaved)
    else:
        pos = torch.cat([torch.arange(int(cu_seqlens[b + 1] - cu_seqlens[b])) +
                         (int(seqlen_offsets[b]) if torch.is_tensor(seqlen_offsets) else seqlen_offsets)
                         for b in range(len(cu_seqlens) - 1)])
        out = _rotate(x, cos[pos][:, None], sin[pos][:, None], interleaved)
    if inplace:
        x.copy_(out)
        return x
    return out


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for base**(-2i/dim) frequencies, applied to q and k ((batch, seqlen, nheads, d))."""

    def __init__(self, dim, base=10000.0, interleaved=False, scale_base=None, device=None):
        super().__init__()
        if scale_base is not None:
            raise ValueError("attn.flash_attn.layers.rotary.RotaryEmbedding: scale_base: XPos is not supported")
        self.dim, self.base, self.interleaved = dim, float(base), interleaved
        self.register_buffer("inv_freq", 1.0 / (self.base ** (torch.arange(0, dim, 2, device=device).float() / dim)),
                             persistent=False)

    def _tables(self, seqlen, dtype):
        freqs = torch.outer(torch.arange(seqlen, dtype=torch.float32), self.inv_freq)
        return torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)

    def forward(self, q, k, seqlen_offset=0):
        cos, sin = self._tables(q.shape[1] + int(seqlen_offset if not torch.is_tensor(seqlen_offset)
                                                else seqlen_offset.max()), q.dtype)
        return (apply_rotary_emb(q, cos, sin, self.interleaved, seqlen_offsets=seqlen_offset),
                apply_rotary_emb(k, cos, sin, self.interleaved, seqlen_offsets=seqlen_offset))
