"""flash_attn's module layout on attn, so code written for flash-attn runs unchanged on the CPU:

    import attn.flash_attn; attn.flash_attn.install()   # then `import flash_attn` finds attn's

install() registers this package as `flash_attn` (and its submodules flash_attn.flash_attn_interface,
flash_attn.bert_padding, flash_attn.layers.rotary) in sys.modules, and flash_attn_interface.flash_attn_gpu as
flash-attn's C++ extension, `flash_attn_2_cuda`. It refuses when the real flash_attn (or its extension) is
already imported."""
import sys

from ..interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                         flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                         flash_attn_with_kvcache)

__version__ = "2.8.0"  # the flash-attn API this package mirrors

_SUBMODULES = ("flash_attn_interface", "bert_padding", "layers", "layers.rotary")


def install():
    """Makes `import flash_attn` (and its submodules) resolve to this package, and `import flash_attn_2_cuda` to
    flash_attn_interface.flash_attn_gpu."""
    import importlib
    current = sys.modules.get("flash_attn")
    if current is not None and current is not sys.modules[__name__]:
        raise RuntimeError("attn.flash_attn.install: flash_attn: another flash_attn is already imported")
    gpu = importlib.import_module(__name__ + ".flash_attn_gpu")
    extension = sys.modules.get("flash_attn_2_cuda")
    if extension is not None and extension is not gpu:
        raise RuntimeError("attn.flash_attn.install: flash_attn_2_cuda: flash-attn's extension is already imported")
    sys.modules["flash_attn"] = sys.modules[__name__]
    for name in _SUBMODULES:
        sys.modules["flash_attn." + name] = importlib.import_module(__name__ + "." + name)
    sys.modules["flash_attn_2_cuda"] = gpu
