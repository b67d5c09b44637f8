"""attn: exact, IO-aware attention kernels (FlashAttention-style tiling) with flash-attn's API.

    import attn
    out = attn.flash_attn_func(q, k, v, causal=True)   # torch tensors on the CPU, differentiable

docs/python.md lists every function and what differs from flash-attn.
"""
from . import check, io
from ._C import AttnError, info
from ._threads import get_num_threads, set_num_threads
from .merge import merge_state, merge_state_in_place, merge_states
from .interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                        flash_attn_with_kvcache)

__all__ = ["AttnError", "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_with_kvcache",
           "get_num_threads", "info", "merge_state", "merge_state_in_place", "merge_states", "set_num_threads"]
__version__ = "0.1.0"
