#!/usr/bin/env python3
"""LICENSE says what meson.build declares: the `license :` of project() names the text in LICENSE.

  test_license.py SOURCE_DIR
"""
import os
import re
import sys

# The first words of each license's own text, by SPDX id (add one here when the license changes).
OPENINGS = {
    "Apache-2.0": ("Apache License", "Version 2.0, January 2004", "END OF TERMS AND CONDITIONS"),
    "MIT": ("Permission is hereby granted, free of charge",),
    "BSD-3-Clause": ("Redistribution and use in source and binary forms",),
}


def main(source):
    with open(os.path.join(source, "meson.build")) as f:
        m = re.search(r"project\(.*?license\s*:\s*'([^']+)'", f.read(), re.S)
    if not m:
        return "meson.build's project() declares no license"
    spdx = m.group(1)
    if spdx not in OPENINGS:
        return f"meson.build declares {spdx!r}: add its opening words to tests/project/test_license.py"
    path = os.path.join(source, "LICENSE")
    if not os.path.exists(path):
        return f"meson.build declares {spdx} but there is no LICENSE file"
    text = " ".join(open(path).read().split())
    missing = [w for w in OPENINGS[spdx] if w not in text]
    if missing:
        return f"LICENSE is not the {spdx} text meson.build declares: missing {missing}"
    print(f"ok: LICENSE is {spdx}, as meson.build declares")
    return None


if __name__ == "__main__":
    err = main(sys.argv[1])
    if err:
        print("FAIL: " + err, file=sys.stderr)
        sys.exit(1)
