"""Imports libcomm.torch_backend, which registers the "libcomm" backend with torch.distributed, or
exits 77 (meson's SKIP) when the extension was not built (no libtorch-dev when meson ran)."""
import sys

try:
    import libcomm.torch_backend  # noqa: F401
except ImportError as e:
    if "not built" not in str(e):
        raise
    print(f"SKIP: {e}")
    sys.exit(77)
