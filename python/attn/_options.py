"""The options of one attention call as a named tuple, importable without torch (NumPy callers)."""
from typing import Any, NamedTuple, Optional


class AttentionOptions(NamedTuple):
    """Everything of a call but its tensors q, k, v (and cu_seqlens, block_table): read by name. The
    fields are in the order of the parameters that follow the tensors in attn's custom ops and their
    eager wrappers (attn::fwd(q, k, v, softmax_scale, causal, ...)), so `op(q, k, v, *options)` passes
    each field to the parameter of its name; their names are also the keywords of attn._C's kernels."""
    softmax_scale: Optional[float]  # None: 1 / sqrt(head_dim)
    causal: bool
    window_left: int  # -1: unbounded
    window_right: int
    softcap: float  # 0: no soft-capping
    alibi_slopes: Any  # a tensor or NumPy array, (nheads,) or (batch, nheads), or None
    dropout_p: float
    seed: int  # the dropout mask's seed (0 without dropout)
    num_threads: int  # 0: OpenMP's default
    sinks: Any  # a tensor (nheads,) of sink logits, or None
