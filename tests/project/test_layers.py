#!/usr/bin/env python3
"""Floors include only downwards (docs/design.md, "The floors").

    tests/project/test_layers.py [ROOT]              check the tree; exit 1 naming each wrong include
    tests/project/test_layers.py --self-test [ROOT]  plant wrong includes in a copy; exit 1 unless each is caught

The floors, lowest first: the ABI (libcomm/include), base (libcomm/base), transports and
topology (side by side: neither includes the other), the core (libcomm/src), the engine
(libcomm/src/engine). A quoted include is resolved as the compiler would: the including file's
folder, then the include folders its floor's meson library has. A header it finds on a higher floor
(or on the other side of transports/topology) is a wrong include. An include that names a floor
by path ("libcomm/src/...", "transports/...") is wrong everywhere: floors are reached through
their include folders, and tools and benchmarks use the public header or a library's folder.

The core never names a transport (docs/design.md, "The floors"): no file under libcomm/src includes
from a transport's own folder (transports/<name>/; the floor's shared parts, transport.h,
registry.h and common/, are its interface, and nccl/ is the NCCL wrapper the device path stands
on), uses a transport's namespace (transport::sock::), or spells a transport's name in a string
("socket", "shm+ucx"): it reaches them through the registry (transports/registry.h). The engine
reaches the core through engine_view.h, never communicator.h.
"""
import os
import re
import shutil
import sys
import tempfile

FLOORS = [  # (name, folder, rank); the first folder that holds a file is its floor
    ("engine", "libcomm/src/engine", 4),
    ("core", "libcomm/src", 3),
    ("base", "libcomm/base", 1),
    ("abi", "libcomm/include", 0),
    ("transports", "transports", 2),
    ("topology", "topology", 2),
]
# The include folders each floor's library is built with (meson.build files).
SEARCH = {
    "abi": ["libcomm/include"],
    "base": ["libcomm/include", "libcomm/base"],
    "transports": ["libcomm/include", "libcomm/base", "transports"],
    "topology": ["libcomm/include", "libcomm/base", "topology"],
    "core": ["libcomm/include", "libcomm/base", "transports", "topology", "libcomm/src"],
    "engine": ["libcomm/include", "libcomm/base", "transports", "topology", "libcomm/src"],
}
GENERATED = {"topology_config.h": "topology"}  # configure_file outputs, by floor
BY_PATH = re.compile(r"^(\.\./)*(libcomm/(src|base)|transports|topology)/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".cc", ".h", ".c", ".cpp", ".hpp")


def floor_of(rel):
    for name, folder, rank in FLOORS:
        if rel == folder or rel.startswith(folder + "/"):
            return name, rank
    return None, None


def rank_of(name):
    return next(rank for n, _, rank in FLOORS if n == name)


ALL_FOLDERS = ["libcomm/include", "libcomm/base", "transports", "topology", "libcomm/src"]


def resolve(root, rel, inc, floor):
    """The file the compiler finds; else the one it would find with every floor's folder (a
    wrong include that does not compile is still named here)."""
    here = os.path.dirname(rel)
    for base in [here] + SEARCH.get(floor, []) + ALL_FOLDERS:
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


# transports/ folders that are not a transport: the floor's shared part and the NCCL wrapper.
NOT_A_TRANSPORT = {"common", "nccl"}
CODE_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def transport_names(root):
    """The registry's names (rows of transports/registry.cc) and every transport folder's."""
    names = set()
    top = os.path.join(root, "transports")
    if os.path.isdir(top):
        names |= {d for d in os.listdir(top) if os.path.isdir(os.path.join(top, d)) and d not in NOT_A_TRANSPORT}
    reg = os.path.join(top, "registry.cc")
    if os.path.isfile(reg):
        with open(reg, encoding="utf-8") as fh:
            names |= set(re.findall(r'\{\s*"([a-z0-9_]+)"\s*,', fh.read()))
    return names


def strip_comments(text):
    """The code of a C++ file with its comments blanked (line numbers kept), strings kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def core_names_transport(rel, text, names, found_includes):
    """Where a file of the core (libcomm/src, engine included) names a transport."""
    problems = []
    code = strip_comments(text)
    for line_no, found in found_includes:
        parts = found.split("/")
        if len(parts) > 2 and parts[0] == "transports" and parts[1] in names:
            problems.append(f"{rel}:{line_no}: includes {found}: the core never includes a transport's folder; "
                            "reach transports through registry.h (docs/design.md, \"The floors\")")
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    literal = re.compile(rf"^({alternatives})(\+({alternatives}))?$")
    namespace = re.compile(rf"\btransport::(sock|{alternatives})::")
    for m in CODE_STRING.finditer(code):
        if literal.match(m.group(1)):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line}: the string \"{m.group(1)}\" names a transport; the core asks the "
                            "registry (a TransportInfo field) instead (docs/design.md, \"The floors\")")
    for m in namespace.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        problems.append(f"{rel}:{line}: {m.group(0)} is a transport's own namespace; the core never uses it")
    return problems


def check(root):
    problems = []
    names = transport_names(root)
    for top in ["libcomm", "transports", "topology", "tools", "bench"]:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                floor, rank = floor_of(rel)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                found_includes = []
                for m in INCLUDE.finditer(text):
                    inc = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    where = f"{rel}:{line}: #include \"{inc}\""
                    if BY_PATH.match(inc):
                        problems.append(f"{where}: names a floor by path; include it through the floor's include folder")
                        continue
                    if floor is None:
                        continue  # tools and benchmarks: only the by-path rule
                    if inc in GENERATED:
                        target, target_rank = GENERATED[inc], rank_of(GENERATED[inc])
                    else:
                        found = resolve(root, rel, inc, floor)
                        if found is None:
                            continue  # not ours (a system header in quotes) or not found at all: the compiler says
                        found_includes.append((line, found))
                        target, target_rank = floor_of(found)
                        if target is None:
                            continue
                    if target_rank > rank or (target_rank == rank and target != floor):
                        problems.append(f"{where}: the {floor} floor includes the {target} floor's header; "
                                        "floors include only downwards (docs/design.md, \"The floors\")")
                if floor in ("core", "engine"):
                    problems += core_names_transport(rel, text, names, found_includes)
                if floor == "engine":
                    problems += [f"{rel}:{line}: includes {found}: the engine reaches the core through "
                                 "engine_view.h (and comm.h), not the communicator's insides"
                                 for line, found in found_includes if found == "libcomm/src/communicator.h"]
    return problems


def self_test(root):
    """Each planted include must be reported; the untouched copy must pass."""
    plants = [
        ("transports/transport.h", '#include "communicator.h"', "a transport including the core"),
        ("topology/policy.h", '#include "socket/socket_transport.h"', "topology including a transport"),
        ("libcomm/base/status.h", '#include "transport.h"', "base including transports"),
        ("libcomm/src/communicator.h", '#include "engine/engine.h"', "the core including the engine"),
        ("libcomm/src/comm.cc", '#include "transports/transport.h"', "an include naming a floor by path"),
        ("libcomm/src/comm.cc", '#include "socket/net.h"', "the core including a transport's folder"),
        ("libcomm/src/connect.cc", '#include "routed/routed_transport.h"', "the core including a transport's folder"),
        ("libcomm/src/engine/step.cc", '#include "shm/layout.h"', "the engine including a transport's folder"),
        ("libcomm/src/engine/stats.cc", '#include "communicator.h"', "the engine including the communicator"),
        ("libcomm/src/connect.cc", 'static const bool kLikely = kind == "socket";', "the core naming a transport"),
        ("libcomm/src/tuning/profile.cc", 'const char* kPair = "shm+ucx";', "the core naming a transport pair"),
        ("libcomm/src/comm.cc", 'using transport::sock::SockAddr;', "the core using a transport's namespace"),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for top in ["libcomm", "transports", "topology", "tools", "bench"]:
            shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
        base = check(tmp)
        if base:
            print("self-test: the untouched tree already fails:\n  " + "\n  ".join(base))
            return 1
        for rel, line, what in plants:
            path = os.path.join(tmp, rel)
            with open(path) as fh:
                original = fh.read()
            with open(path, "w") as fh:
                fh.write(line + "\n" + original)
            found = [p for p in check(tmp) if p.startswith(rel + ":1:")]
            print(f"self-test: {what} ({rel}): {'caught' if found else 'MISSED'}")
            failures += 0 if found else 1
            with open(path, "w") as fh:
                fh.write(original)
    return 1 if failures else 0


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
    if "--self-test" in argv:
        return self_test(root)
    problems = check(root)
    for p in problems:
        print(p)
    print(f"{len(problems)} wrong include(s)" if problems else "every include goes downwards")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
