"""The IO model for learners (the spec's traffic counts; include/attn/io_model.hpp): how many bytes
the standard algorithm, tiled Algorithm 1 and FlashAttention-2 move between HBM and SRAM.

    >>> r = attn.io.model(seqlen=4096, head_dim=64, sram_bytes=192 * 1024)
    >>> round(r["standard"]["bytes"] / 1e6, 1), round(r["tiled"]["bytes"] / 1e6, 1)   # 136.3 MB vs 18.7 MB
"""
from . import _C


def model(seqlen=4096, head_dim=64, sram_bytes=192 * 1024, element_bytes=2, bandwidth=3.35e12, derate=0.8):
    """The closed forms at one point: a dict with standard / tiled / fa2 traffic (elements, bytes,
    seconds at `bandwidth` x `derate`, block sizes, passes), sram_elements, reduction, score_matrix_bytes."""
    return _C.io_model(int(seqlen), int(head_dim), float(sram_bytes), float(element_bytes), float(bandwidth),
                       float(derate))


def count(schedule, n, d, m, seed=1):
    """Runs "algorithm1" or "fa2" on random f64 data with every HBM access counted (m = SRAM elements):
    reads, writes, elements, sram_peak_elements and max_abs_diff against the reference."""
    return _C.io_count(schedule, int(n), int(d), int(m), int(seed))
