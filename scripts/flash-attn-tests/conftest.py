"""Runs flash-attn's tests/test_flash_attn.py on attn, on the CPU: `import flash_attn` resolves to attn
(attn.flash_attn.install()), the file's device strings were set to "cpu" by sed, and its GPU queries are
answered as an A100's (sm80, 80 GiB). A deterministic sample: FA_SAMPLE cases per test function (0: all),
drawn with random.Random(FA_SEED) from the collected cases of each function."""
import os
import random
import types

import torch

import attn.flash_attn

attn.flash_attn.install()
torch.cuda.get_device_capability = lambda *a, **k: (8, 0)
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(total_memory=80 * 2**30, name="cpu")


def pytest_collection_modifyitems(config, items):
    n, seed = int(os.environ.get("FA_SAMPLE", "5")), int(os.environ.get("FA_SEED", "2026"))
    if n <= 0:
        return
    by_function = {}
    for item in items:
        by_function.setdefault(item.originalname, []).append(item)
    keep = []
    for name in sorted(by_function):
        cases = by_function[name]
        keep.extend(random.Random(f"{seed}:{name}").sample(cases, min(n, len(cases))))
    chosen = set(id(i) for i in keep)
    config.hook.pytest_deselected(items=[i for i in items if id(i) not in chosen])
    items[:] = [i for i in items if id(i) in chosen]
