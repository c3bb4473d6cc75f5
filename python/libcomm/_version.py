# The package's release: meson.build's project version (tests/python/test_pip_install.py checks).
__version__ = "1.0.0"
