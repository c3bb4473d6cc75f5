"""The house a newcomer reads (issue 37): no source file too long to read in one sitting, and every
pointer into the docs resolves.

(a) No tracked .cc, .h, .c, .py or .sh file over 600 lines (tests/fixtures aside: they are data);
    a long file is split along what it does, its shared helpers in a small header.
(b) Every markdown link in a tracked *.md file to a local file resolves, and so does its heading
    anchor, by GitHub's rules (lowercase, spaces to '-', punctuation dropped, '-1', '-2' for repeats).
(c) Every citation of a doc heading, the way code cites docs (`docs/design.md, "The floors"`,
    also across a comment's lines and as `"The C ABI contract" and "Hot keys"`), names a heading
    of that file, or the title of a paragraph with an anchor of its own (design.md's
    <a id="hot-keys">); a citation may stop where the heading's subtitle starts ("Messy networks"
    for "Messy networks: every chosen interface, ...").

Every violation is printed with file:line. --self-test plants one violation of each kind in a
copy of the tree and shows that each is found, and nothing else."""
import bisect
import os
import re
import shutil
import subprocess
import sys
import tempfile

MAX_LINES = 600
SOURCE_SUFFIXES = (".cc", ".h", ".c", ".py", ".sh")
SKIP_DIRS = ("tests/fixtures/",)
# Issue 37 is done by several sessions at once: these files belong to others, who split or
# rewrite them as this test lands. Each entry comes off its list in the change that fixes it, and an
# entry that no longer applies is itself reported, so that the lists go once they are empty.
# Files over MAX_LINES (being split along what they test):
TOO_LONG_FOR_NOW = set()
# Citations of headings that do not exist, as (file, cited heading), in docs being rearranged:
BROKEN_FOR_NOW = set()


def tracked_files(root):
    """The repository's files: git's list where the root is a checkout, else a walk that skips
    build folders and hidden ones (the self-test's copy)."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return sorted(f for f in files if os.path.isfile(os.path.join(root, f)))
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build", "subprojects"))]
        for name in names:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def read_lines(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read().split("\n")


def line_count(root, rel):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read().count(b"\n")


# ---- (a) length ------------------------------------------------------------------------------

def long_files(root, files, allowed):
    found = []
    for rel in files:
        if not rel.endswith(SOURCE_SUFFIXES) or rel.startswith(SKIP_DIRS) or rel in allowed:
            continue
        n = line_count(root, rel)
        if n > MAX_LINES:
            found.append(f"{rel}:{n}: {n} lines, over {MAX_LINES}: split it along what it does")
    return found


# ---- headings and their anchors ----------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)\s*=\s*\"([^\"]+)\"", re.I)


def outside_fences(lines):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def plain_heading(text):
    """A heading's text as GitHub renders it: links to their text, no code or emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[`*]", "", text).strip()


def slug(text):
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to '-'."""
    text = plain_heading(text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


class Doc:
    def __init__(self, lines):
        self.headings = []  # plain texts
        self.anchors = set()
        seen = {}
        for _, line in outside_fences(lines):
            m = HEADING.match(line)
            if m:
                self.headings.append(plain_heading(m.group(2)))
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                self.anchors.add(base if k == 0 else f"{base}-{k}")
            for a in HTML_ANCHOR.findall(line):
                self.anchors.add(a)

    def names(self, cited):
        """True when `cited` is a heading, a heading up to where its subtitle starts, or the title of
        a paragraph with an anchor of its own (<a id="hot-keys"></a>**Hot keys.**)."""
        if slug(" ".join(cited.split())) in self.anchors:
            return True
        want = " ".join(plain_heading(cited).split()).lower()
        for h in self.headings:
            h = " ".join(h.split()).lower()
            if h == want or (h.startswith(want) and re.match(r"\s*[:(,;\u2014]|\s+-\s", h[len(want):])):
                return True
        return False


class Docs:
    def __init__(self, root):
        self.root = root
        self.cache = {}

    def get(self, rel):
        rel = os.path.normpath(rel)
        if rel not in self.cache:
            path = os.path.join(self.root, rel)
            self.cache[rel] = Doc(read_lines(self.root, rel)) if os.path.isfile(path) else None
        return self.cache[rel]


# ---- (b) markdown links ------------------------------------------------------------------------

INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def broken_links(root, files, docs):
    found = []
    for rel in files:
        if not rel.endswith(".md") or rel.startswith(SKIP_DIRS):
            continue
        here = os.path.dirname(rel)
        for n, line in outside_fences(read_lines(root, rel)):
            text = INLINE_CODE.sub("", line)
            targets = INLINE_LINK.findall(text)
            m = REFERENCE_LINK.match(text)
            if m:
                targets.append(m.group(1))
            for target in targets:
                if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # a URL (http:, mailto:, ...): not this test's business
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(here, path)) if path else rel
                if dest.startswith(".."):
                    found.append(f"{rel}:{n}: link to {target}: outside the repository")
                    continue
                if not os.path.exists(os.path.join(root, dest)):
                    found.append(f"{rel}:{n}: link to {target}: no file {dest}")
                    continue
                if anchor and dest.endswith(".md"):
                    doc = docs.get(dest)
                    if anchor.lower() not in doc.anchors:
                        found.append(f"{rel}:{n}: link to {target}: {dest} has no heading #{anchor}")
    return found


# ---- (c) citations of headings -----------------------------------------------------------------

# Comment and string marks at the start of a line, dropped so that a citation can run on over a
# comment's next line: //, #, /*, *, and a docstring's quotes.
LEAD = re.compile(r"^\s*(?://+|#+|/\*+|\*+|\"\"\"|''')?\s?")
# A doc's path (not inside a string literal: "README.md" in code names a file, cites nothing), a
# comma or a space, the heading in double quotes, and perhaps more headings after "and" or ",".
CITATION = re.compile(r"(?<![\"'\w./-])((?:[\w.-]+/)*[\w.-]+\.md)(?:\s*,\s*|\s+)\"([^\"]{1,120})\""
                      r"((?:\s*(?:,|and|or)\s*\"[^\"]{1,120}\")*)")
MORE = re.compile(r"\"([^\"]{1,120})\"")


def citations(lines, markdown):
    """(line number, doc path, heading) for each citation in a file's text. In markdown a link's
    text ([design/transports.md, "Connections"](design.md#connections)) is left to broken_links."""
    if markdown:
        lines = [INLINE_LINK.sub("[]", line) for line in lines]
    # One stream of the file's text with the leading marks dropped, lines joined by a space, and a
    # map from each offset back to its line.
    parts, starts, at = [], [], 0
    for line in lines:
        piece = LEAD.sub("", line, count=1).replace('\\"', '"')
        starts.append(at)
        parts.append(piece)
        at += len(piece) + 1
    text = " ".join(parts)

    for m in CITATION.finditer(text):
        n = bisect.bisect_right(starts, m.start())
        yield n, m.group(1), m.group(2)
        for more in MORE.findall(m.group(3)):
            yield n, m.group(1), more


def resolve_doc(root, rel, cited):
    """The cited doc's path from the root: as written (docs/design.md), else beside the citing file."""
    for cand in (cited, os.path.join(os.path.dirname(rel), cited)):
        cand = os.path.normpath(cand)
        if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def broken_citations(root, files, docs):
    found = []
    for rel in files:
        if rel.startswith(SKIP_DIRS) or rel == "tests/project/test_house.py":
            continue  # this file's own examples are not citations
        with open(os.path.join(root, rel), "rb") as f:
            raw = f.read()
        if b"\0" in raw[:8192] or b".md" not in raw:
            continue  # a binary file, or one that names no doc
        for n, cited, heading in citations(read_lines(root, rel), rel.endswith(".md")):
            dest = resolve_doc(root, rel, cited)
            if dest is None:
                found.append(f"{rel}:{n}: cites {cited}, \"{heading}\": no file {cited}")
            elif not docs.get(dest).names(heading):
                found.append(f"{rel}:{n}: cites {cited}, \"{heading}\": {dest} has no such heading")
    return found


def violations(root, too_long=frozenset(TOO_LONG_FOR_NOW), broken=frozenset(BROKEN_FOR_NOW)):
    files = tracked_files(root)
    docs = Docs(root)
    found = long_files(root, files, too_long) + broken_links(root, files, docs)
    cites = broken_citations(root, files, docs)
    for rel, heading in sorted(broken):
        mine = [c for c in cites if c.startswith(rel + ":") and f'"{heading}"' in c]
        if not mine:
            found.append(f"tests/project/test_house.py:1: ({rel}, \"{heading}\") is fixed: take it off BROKEN_FOR_NOW")
        cites = [c for c in cites if c not in mine]
    for rel in sorted(too_long):
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or line_count(root, rel) <= MAX_LINES:
            found.append(f"tests/project/test_house.py:1: {rel} is split: take it off TOO_LONG_FOR_NOW")
    return found + cites


def self_test(root):
    """Plants one violation of each kind in a copy of the tree: each must be found, and nothing else
    (the copy as it is must be clean, and a long file under tests/fixtures is not reported)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "tree")
        for rel in tracked_files(root):
            os.makedirs(os.path.dirname(os.path.join(copy, rel)), exist_ok=True)
            shutil.copy2(os.path.join(root, rel), os.path.join(copy, rel))
        clean = violations(copy)
        if clean:
            print("self-test: the copy of the tree is not clean to begin with:\n" + "\n".join(clean))
            return 1
        # What each planted file must produce (a prefix of one reported line), or None: nothing.
        planted = {
            "libcomm/src/planted_long.cc": ("// a long file\n" * (MAX_LINES + 1), ["libcomm/src/planted_long.cc:"]),
            "tests/fixtures/planted_long.py": ("# data\n" * (MAX_LINES + 1), None),
            "docs/planted.md": ("# Planted\n\nSee [the floors](design.md#no-such-heading-here), "
                                "[a file](no-such-file.md) and [this](#planted).\n",
                                ["docs/planted.md:3: link to design.md#no-such-heading-here",
                                 "docs/planted.md:3: link to no-such-file.md"]),
            "libcomm/src/planted_cite.cc": ("// As docs/design.md says (docs/design.md,\n"
                                            "// \"A heading nobody wrote\" and \"The floors\").\n",
                                            ["libcomm/src/planted_cite.cc:1: cites docs/design.md, \"A heading"]),
        }
        for rel, (text, _) in planted.items():
            with open(os.path.join(copy, rel), "w") as f:
                f.write(text)
        found = violations(copy)
        expected = [e for _, (_, marks) in planted.items() for e in marks or []]
        missed = [e for e in expected if not any(v.startswith(e) for v in found)]
        extra = [v for v in found if not any(v.startswith(e) for e in expected)]
        # The lists of others' files: without them their files are reported, and an entry that no
        # longer applies is reported too.
        unlisted = violations(copy, too_long=frozenset(), broken=frozenset())
        stale = violations(copy, too_long=frozenset(TOO_LONG_FOR_NOW | {"tests/main.cc"}))
    for e in missed:
        print(f"self-test: not found: {e}...")
    for v in extra:
        print(f"self-test: reported, not planted: {v}")
    ok = not missed and not extra
    for rel in TOO_LONG_FOR_NOW:
        if not any(v.startswith(rel + ":") for v in unlisted):
            print(f"self-test: {rel} off the list was not reported")
            ok = False
    for rel, heading in BROKEN_FOR_NOW:
        if not any(v.startswith(rel + ":") and f'"{heading}"' in v for v in unlisted):
            print(f"self-test: ({rel}, \"{heading}\") off the list was not reported")
            ok = False
    if not any("tests/main.cc is split" in v for v in stale):
        print("self-test: a short file on TOO_LONG_FOR_NOW was not reported")
        ok = False
    if not ok:
        return 1
    print("self-test: every planted violation was found, and nothing else:\n" + "\n".join(found))
    return 0


def main():
    args = [a for a in sys.argv[1:] if a != "--self-test"]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
    if "--self-test" in sys.argv:
        return self_test(root)
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} violations (tests/project/test_house.py says what each check wants)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
