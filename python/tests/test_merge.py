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


def test_merge_state_in_place_equals_merge_state():
    v_a, v_b = torch.randn(6, 3, 8), torch.randn(6, 3, 8)
    s_a, s_b = torch.randn(6, 3), torch.randn(6, 3)
    s_b[2, 1] = float("-inf")
    want, want_s = attn.merge_state(v_a, s_a, v_b, s_b)
    attn.merge_state_in_place(v_a, s_a, v_b, s_b)
    assert torch.equal(v_a, want) and torch.equal(s_a, want_s)


def test_merge_state_in_place_bad_shape_is_named():
    import pytest
    v, s = torch.randn(6, 3, 8), torch.randn(6, 3)
    before = v.clone()
    with pytest.raises(attn.AttnError, match="other: head_dim"):
        attn.merge_state_in_place(v, s, torch.randn(6, 3, 4), torch.randn(6, 3))
    assert torch.equal(v, before)
