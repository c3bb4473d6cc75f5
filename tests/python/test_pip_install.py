"""`pip install ./python` into a fresh venv (--system-site-packages: numpy and torch from Debian),
offline (--no-build-isolation --no-index), then libcomm imported by the venv's python without
PYTHONPATH, from a directory outside the repository. Checks that the import comes from the venv,
that the package's version is meson's, and that the library is found through LIBCOMM_LIBRARY and,
without it, through the loader's search path (LD_LIBRARY_PATH stands in for an installed
libcomm.so.1; the package is not in a source checkout, so the repository's build/ is not used).

    test_pip_install.py SOURCE_ROOT MESON_PROJECT_VERSION   (LIBCOMM_LIBRARY: the built library)
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run(cmd, env, cwd):
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(map(str, cmd))} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    source, meson_version = Path(sys.argv[1]), sys.argv[2]
    library = os.environ["LIBCOMM_LIBRARY"]
    with tempfile.TemporaryDirectory(prefix="libcomm-pip-") as tmp:
        tmp = Path(tmp)
        # pip builds in the source tree (build/, *.egg-info): a copy keeps the checkout clean.
        src = tmp / "src"
        shutil.copytree(source / "python", src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "LIBCOMM_LIBRARY", "LD_LIBRARY_PATH", "VIRTUAL_ENV")}
        venv = tmp / "venv"
        # --without-pip and Debian's pip (the same 23.0 that ensurepip would copy in) aimed at the
        # venv with --python: 2 s instead of 15 s for ensurepip.
        run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages", venv], env, tmp)
        py = venv / "bin" / "python"
        run(["/usr/bin/python3", "-m", "pip", "--python", py, "install", "--quiet",
             "--no-build-isolation", "--no-index", "--disable-pip-version-check", src], env, tmp)
        probe = ("import libcomm, sys; print(libcomm.__file__); print(libcomm.__version__); "
                 "print(libcomm.library_path); print(*libcomm.version())")
        out = run([py, "-c", probe], dict(env, LIBCOMM_LIBRARY=library), tmp).split("\n")
        where, version, loaded = out[0], out[1], out[2]
        if not Path(where).resolve().is_relative_to(venv.resolve()):
            sys.exit(f"FAIL: libcomm imported from {where}, not from the venv {venv}")
        if version != meson_version:
            sys.exit(f"FAIL: libcomm.__version__ {version} != meson's project version {meson_version}"
                     " (python/libcomm/_version.py)")
        if loaded != library:
            sys.exit(f"FAIL: loaded {loaded}, LIBCOMM_LIBRARY is {library}")
        # No LIBCOMM_LIBRARY: the soname through the loader's search path.
        lib_dir = str(Path(library).resolve().parent)
        out = run([py, "-c", probe], dict(env, LD_LIBRARY_PATH=lib_dir), tmp).split("\n")
        if out[2] != "libcomm.so.1":
            sys.exit(f"FAIL: without LIBCOMM_LIBRARY the package loaded {out[2]}, not the soname "
                     "from the loader's search path")
        # The DDP wrapper's module imports too (torch from the system site-packages).
        run([py, "-c", "import libcomm.torch_ddp, libcomm.engine"], dict(env, LIBCOMM_LIBRARY=library), tmp)
        print(f"ok: pip install into a fresh venv, libcomm {version} from {where}, library {loaded}")


if __name__ == "__main__":
    main()
