"""flash_attn.bert_padding: moving between padded (batch, seqlen, ...) tensors and the packed
(total, ...) layout of the varlen functions, with the cu_seqlens they need."""
import torch
import torch.nn.functional as F


def index_first_axis(x, indices):
    """x[indices] along the first axis (flash-attn wraps this in an autograd Function; indexing is one)."""
    return x[indices]


def index_put_first_axis(values, indices, first_axis_dim):
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    out[indices] = values
    return out


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int, 1 = token ->
    (hidden_states (total, ...), indices, cu_seqlens int32 (batch + 1), max_seqlen_in_batch, seqused int32
    (batch,)). With unused_mask (tokens that are kept but not attended), those are packed too and seqused
    counts only the attended ones."""
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item()) if seqlens_in_batch.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    packed = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return packed, indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of unpad_input: (total, ...) -> (batch, seqlen, ...), zeros at the padding."""
    return index_put_first_axis(hidden_states, indices, batch * seqlen).view(batch, seqlen, *hidden_states.shape[1:])
