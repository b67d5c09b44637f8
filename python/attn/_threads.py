"""The thread count attn's kernels use: attn's own OpenMP pool, separate from torch's. 0 (the default)
means OpenMP's default: OMP_NUM_THREADS if set, else every core. Results do not depend on it."""
_num_threads = 0


def set_num_threads(n: int) -> None:
    global _num_threads
    if int(n) < 0:
        raise ValueError(f"attn.set_num_threads: n: must be >= 0 (0 = OpenMP's default), got {n}")
    _num_threads = int(n)


def get_num_threads() -> int:
    return _num_threads
