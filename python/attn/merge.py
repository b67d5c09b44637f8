"""FlashInfer's merge_state / merge_states on (output, lse) pairs of attention over disjoint key sets,
through attn::merge_states (include/attn/merge.hpp: the online softmax's merge, written once). s is the
natural-log log-sum-exp that attn and flash-attn return (flash_attn_*(..., return_attn_probs=True),
flash_attn_with_kvcache(..., return_softmax_lse=True)), f32 (f64 for f64 outputs); -inf marks a state
that saw no key."""
from . import _C


def merge_states(v, s):
    """v (seq_len, num_states, num_heads, head_dim), s (seq_len, num_states, num_heads) ->
    (V (seq_len, num_heads, head_dim), S (seq_len, num_heads)), merged in state order."""
    import torch
    seq, _, heads, dim = v.shape
    out = torch.empty((seq, heads, dim), dtype=v.dtype)
    lse = torch.empty((seq, heads), dtype=s.dtype)
    _C.merge_states(v.detach(), s.detach(), out.unsqueeze(1), lse.unsqueeze(1))
    return out, lse


def merge_state(v_a, s_a, v_b, s_b):
    """Two states: v (seq_len, num_heads, head_dim), s (seq_len, num_heads) each -> (V, S)."""
    import torch
    return merge_states(torch.stack((v_a, v_b), dim=1), torch.stack((s_a, s_b), dim=1))


def merge_state_in_place(v, s, v_other, s_other):
    """FlashInfer's merge_state_in_place: v (seq_len, num_heads, head_dim) and s (seq_len, num_heads)
    become the merge of (v, s) and (v_other, s_other); returns None."""
    _C.merge_state_in_place(v.unsqueeze(1), s.unsqueeze(1), v_other.detach().unsqueeze(1),
                            s_other.detach().unsqueeze(1))
