#!/usr/bin/env python3
"""Name the tests that failed in a meson build directory, each with the end of its output.

scripts/test.sh prints this last, after the sanitizer tier: a CI log is often read from its tail only,
and meson's own failure report sits hundreds of lines above it (the sanitizer build's warnings
follow). Reads BUILD_DIR/meson-logs/testlog.json.

    scripts/failed_tests.py build [LINES]
"""
import json
import sys
from pathlib import Path

PASSED = {"OK", "SKIP", "EXPECTEDFAIL"}


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    log = Path(sys.argv[1]) / "meson-logs" / "testlog.json"
    lines = int(sys.argv[2]) if len(sys.argv) == 3 else 30
    if not log.is_file():
        print(f"failed_tests.py: no {log} (did meson test run?)")
        return 0
    failed = []
    for row in log.read_text(errors="replace").splitlines():
        test = json.loads(row)
        if test.get("result") not in PASSED:
            failed.append(test)
    if not failed:
        print(f"failed_tests.py: no failed test in {log}")
        return 0
    names = ", ".join(f"{t['name']} ({t['result']}, {t['duration']:.1f} s)" for t in failed)
    print(f"failed in {sys.argv[1]}/: {names}")
    for test in failed:
        output = ((test.get("stdout") or "") + "\n" + (test.get("stderr") or "")).strip().splitlines()
        print(f"\n--- {test['name']}: {test['result']}, return code {test.get('returncode')}, "
              f"{test['duration']:.1f} s; the last {min(lines, len(output))} of {len(output)} lines:")
        for line in output[-lines:]:
            print(line[:400])
    return 0


if __name__ == "__main__":
    sys.exit(main())
