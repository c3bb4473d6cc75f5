#!/usr/bin/python3
"""torch's whole distributed suite on gloo and on libcomm, at each world size asked, and the table
docs/torch-backend.md shows: per run, how many tests passed, failed, were skipped; and every test
that passed on gloo and not on libcomm. libcomm runs the tests that passed on gloo (--libcomm-all:
every test). Long: each test starts its ranks afresh (about 20-25 min per backend and world size on
a quiet 2-core machine, 1.5 h under load; docs/torch-backend.md).

    tests/python/torch_suite_compare.py [--world-sizes 2,3] [--out DIR] [-k PATTERN ...]

Each run is tests/python/torch_suite.py (its docstring says how the suite is run on libcomm);
outcomes go to DIR/<backend>-<ws>.txt, logs to DIR/<backend>-<ws>.log. Exits 1 when some test
passed on gloo and not on libcomm."""

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def outcomes(path):
    result = {}
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, outcome = line.partition(" ")
            result.setdefault(name, outcome)  # the first outcome (a test's error after its success: rare)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", default="2,3")
    parser.add_argument("--out", default="torch-suite")
    parser.add_argument("--timeout", default="120")
    parser.add_argument("--reuse", action="store_true", help="keep DIR's outcome files, only tabulate them")
    parser.add_argument("--libcomm-all", action="store_true",
                        help="run every test on libcomm too (default: the ones that passed on gloo)")
    parser.add_argument("-k", action="append", default=[])
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    missing_total = 0
    print(f"{'run':<14} {'passed':>7} {'failed':>7} {'skipped':>8} {'gloo-only':>10}")
    for ws in args.world_sizes.split(","):
        res = {}
        for backend in ("gloo", "libcomm"):
            results = out / f"{backend}-{ws}.txt"
            if not args.reuse:
                results.unlink(missing_ok=True)
                cmd = [sys.executable, str(HERE / "torch_suite.py"), "--backend", backend, "--world-size", ws,
                       "--timeout", args.timeout, "--results", str(results)]
                for k in args.k:
                    cmd += ["-k", k]
                if backend == "libcomm" and not args.libcomm_all:
                    cmd += [f"TestDistBackendWithSpawn.{t}" for t, o in sorted(res["gloo"].items()) if o == "ok"]
                with open(out / f"{backend}-{ws}.log", "w") as log:
                    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
            res[backend] = outcomes(results)
        only_gloo = sorted(t for t, o in res["gloo"].items() if o == "ok" and res["libcomm"].get(t) != "ok")
        missing_total += len(only_gloo)
        for backend in ("gloo", "libcomm"):
            c = collections.Counter(res[backend].values())
            extra = str(len(only_gloo)) if backend == "libcomm" else ""
            print(f"{backend + ' ' + ws + ' ranks':<14} {c['ok']:>7} {c['FAIL'] + c['ERROR']:>7} "
                  f"{c['skip'] + c['xfail']:>8} {extra:>10}")
        for t in only_gloo:
            print(f"  passes on gloo, not on libcomm ({ws} ranks): {t} ({res['libcomm'].get(t, 'not run')})")
    return 1 if missing_total else 0


if __name__ == "__main__":
    sys.exit(main())
