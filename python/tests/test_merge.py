"""merge_state(s): attention over key chunks, merged, equals attention over all the keys."""
import torch

import attn


def test_chunks_merge_to_the_whole():
    q = torch.randn(1, 7, 4, 32, dtype=torch.float64)
    k, v = torch.randn(1, 50, 4, 32, dtype=torch.float64), torch.randn(1, 50, 4, 32, dtype=torch.float64)
    whole, lse, _ = attn.flash_attn_func(q, k, v, return_attn_probs=True)
    parts, lses = [], []
    for j0, j1 in ((0, 13), (13, 13), (13, 41), (41, 50)):
        if j1 == j0:  # an empty chunk: the neutral state
            parts.append(torch.zeros(1, 7, 4, 32, dtype=torch.float64))
            lses.append(torch.full((1, 4, 7), float("-inf"), dtype=torch.float64))
            continue
        o, s, _ = attn.flash_attn_func(q, k[:, j0:j1], v[:, j0:j1], return_attn_probs=True)
        parts.append(o)
        lses.append(s)
    v_states = torch.stack([p[0] for p in parts], dim=1)           # (seq, states, heads, d)
    s_states = torch.stack([s[0].transpose(0, 1) for s in lses], dim=1)  # (seq, states, heads)
    out, s = attn.merge_states(v_states, s_states)
    assert (out - whole[0]).abs().max().item() <= 1e-12
    assert (s - lse[0].transpose(0, 1)).abs().max().item() <= 1e-12
    two, s2 = attn.merge_state(parts[0][0], lses[0][0].T, parts[2][0], lses[2][0].T)
    o02, l02, _ = attn.flash_attn_func(q, k[:, :41], v[:, :41], return_attn_probs=True)
    assert (two - o02[0]).abs().max().item() <= 1e-12 and (s2 - l02[0].T).abs().max().item() <= 1e-12


def test_bad_lse_dtype_is_named():
    import pytest
    v = torch.randn(3, 2, 1, 4)
    with pytest.raises(attn.AttnError, match="parts_lse: dtype must be f32"):
        attn.merge_states(v, torch.zeros(3, 2, 1, dtype=torch.float64))
