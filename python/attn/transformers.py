"""attn inside Hugging Face transformers, in one line.

    import attn.transformers  # registers "attn"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attn")

Importing this module registers attn through transformers' public extension points:
`AttentionInterface.register("attn", attention_forward)` for the attention layers, and
`AttentionMaskInterface.register("attn", ...)` with transformers' own flash-attention mask (a 2D
padding mask, or None when nothing is padded), so models build the masks flash-attention expects.
Every attention layer then runs through attn's flash-attn functions on CPU tensors, with the
conventions transformers' flash-attention path has: padded batches unpadded into a varlen call,
packed sequences (position_ids restarting at 0, or cu_seq_lens_* kwargs) as varlen, sliding
windows as (w - 1, w - 1), soft-cap, sinks (gpt-oss's s_aux), GQA, dropout in training, the
KV caches of generate(), and a paged cache (block_table kwargs) through flash_attn_with_kvcache.

transformers' own `attn_implementation="flash_attention_2"` cannot be pointed at attn without
patching transformers: its availability check requires the flash-attn distribution's metadata and
a CUDA, MLU or MUSA device (transformers 5.x, utils/import_utils.py, is_flash_attn_2_available), and
its fallback loads kernels from the Hub. docs/python.md says more.
"""

import torch

from . import interface as _fa

NAME = "attn"


def _window(sliding_window, key_length):
    # transformers counts a window by its total size (the current token included); flash-attn's bounds
    # are inclusive, so (w - 1, w - 1), as transformers' flash-attention path passes it.
    if sliding_window is None or key_length <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, sliding_window - 1)


def _cu_seqlens(lengths):
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _unpad(x, valid):
    """x (batch, seq, heads, dim), valid (batch, seq) bool -> (rows of valid positions, their flat indices,
    cu_seqlens, max length)."""
    indices = valid.flatten().nonzero(as_tuple=False).flatten()
    lengths = valid.sum(-1, dtype=torch.int32)
    return x.reshape(-1, *x.shape[2:])[indices], indices, _cu_seqlens(lengths), int(lengths.max())


def _packed_cu_seqlens(position_ids):
    """cu_seqlens of sequences packed into one row, each restarting its positions at 0; None when the
    positions are one increasing run (transformers' _is_packed_sequence, done on the values here)."""
    if position_ids is None or position_ids.shape[0] != 1 or position_ids.shape[-1] == 1:
        return None
    p = position_ids[0]
    starts = (p[1:] <= p[:-1]).nonzero(as_tuple=False).flatten() + 1
    if starts.numel() == 0:
        return None
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), starts, torch.tensor([p.numel()])])
    return bounds.to(torch.int32)


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options):
    out = _fa.flash_attn_varlen_func(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, **options)
    return out[0] if isinstance(out, tuple) else out


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention interface: query (batch, heads, seq_q, dim), key and value (batch, kv_heads,
    seq_k, dim[_v]), attention_mask the 2D padding mask (batch, seq_k) or None -> (out (batch, seq_q,
    heads, dim_v), None)."""
    if kwargs.get("output_attentions", False):
        raise ValueError("attn.transformers: output_attentions: attention weights are not formed; use "
                         "attn_implementation='eager' to get them")
    batch, _, seq_q, _ = query.shape
    seq_k = key.shape[2]
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    options = dict(dropout_p=dropout if module.training else 0.0, softmax_scale=scaling, causal=causal,
                   window_size=_window(sliding_window, seq_k), softcap=softcap or 0.0,
                   sinks=None if s_aux is None else s_aux.float())

    block_table = kwargs.get("block_table")
    if block_table is not None:  # a paged cache (continuous batching): decode rows, appended as they attend
        cu_k = kwargs["cu_seq_lens_k"]
        q1, k1, v1 = (x.reshape(-1, 1, *x.shape[-2:]) for x in (q, k, v))
        n = k1.shape[0]
        cache_seqlens = (cu_k[1:n + 1] - cu_k[:n] - 1).to(torch.int32)
        options.pop("dropout_p")
        out = _fa.flash_attn_with_kvcache(q1, kwargs["k_cache"], kwargs["v_cache"], k1, v1, cache_seqlens=cache_seqlens,
                                          block_table=block_table.to(torch.int32), **options)
        return out.view(batch, -1, *out.shape[-2:]), None

    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # generate() passes an all-ones mask: nothing to unpad
    if attention_mask is not None:  # padded: unpad queries and keys into one varlen call, then pad back
        valid_k = attention_mask.bool()
        valid_q = valid_k if seq_q == seq_k else (
            torch.ones(batch, seq_q, dtype=torch.bool) if seq_q == 1 else valid_k[:, -seq_q:])
        qs, idx_q, cu_q, max_q = _unpad(q, valid_q)
        ks, _, cu_k, max_k = _unpad(k, valid_k)
        vs, _, _, _ = _unpad(v, valid_k)
        rows = _varlen(qs, ks, vs, cu_q, cu_k, max_q, max_k, **options)
        out = rows.new_zeros(batch * seq_q, *rows.shape[1:])
        out[idx_q] = rows
        return out.view(batch, seq_q, *rows.shape[1:]), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None or cu_k is None:
        cu_q = cu_k = _packed_cu_seqlens(kwargs.get("position_ids"))
    if cu_q is not None:  # sequences packed into one row
        flat = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v))
        max_q = int((cu_q[1:] - cu_q[:-1]).max())
        max_k = int((cu_k[1:] - cu_k[:-1]).max())
        rows = _varlen(*flat, cu_q, cu_k, max_q, max_k, **options)
        return rows.view(batch, -1, *rows.shape[-2:]), None

    if seq_q == 1 and not options["dropout_p"] and not torch.is_grad_enabled():
        # A decode step: attn's decode kernel (split-K over the keys, each kv head's rows read once for
        # its query heads) reads generate()'s cache in place.
        options.pop("dropout_p")
        return _fa.flash_attn_with_kvcache(q, k, v, **options), None
    out = _fa.flash_attn_func(q, k, v, **options)
    return (out[0] if isinstance(out, tuple) else out), None


def register(name=NAME):
    """Registers attn under `name` in transformers' attention and attention-mask interfaces (done once on
    import under "attn"); returns the name, for attn_implementation=."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
    return name


register()
