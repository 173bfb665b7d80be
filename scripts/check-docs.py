#!/usr/bin/env python3
"""Checks the project's Markdown: README.md and every page under docs/.

Fails (exit 1, one line per problem) on:
- a relative link to a file or directory that does not exist;
- a link to an anchor (`page.md#section`, `#section`) that no heading of the page produces
  (GitHub's rule: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats);
- a page under docs/ that docs/README.md does not link to;
- a page under docs/ whose first line does not say who it is for (`> For ...`);
- an inline Mermaid diagram marked `<!-- diagram: FILE -->` that differs from FILE;
- a README.md longer than 300 lines.

Links to other sites (`https:`, `mailto:`) are not followed. Run from anywhere:
`python3 scripts/check-docs.py [ROOT]` (ROOT: the repository, default this script's parent's).
`python3 scripts/check-docs.py --self-test` shows on a scratch tree that each rule can fail.
"""

import os
import re
import sys
import unicodedata

README_MAX_LINES = 300
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
DIAGRAM = re.compile(r"^<!--\s*diagram:\s*(\S+)\s*-->\s*$")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or ch == " " or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
                continue
            if stripped.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield number, line


def anchors_of(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        seen = {}
        found = set()
        for _, line in prose_lines(text):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            for a in HTML_ANCHOR.findall(line):
                found.add(a)
        cache[path] = found
    return cache[path]


def links_of(text):
    """(line number, target) for every Markdown link outside code."""
    for number, line in prose_lines(text):
        line = re.sub(r"(`+).*?\1", "", line)  # inline code spans
        for m in LINK.finditer(line):
            yield number, m.group(1)


def check(root):
    problems = []
    docs = os.path.join(root, "docs")
    pages = [os.path.join(root, "README.md")]
    for dirpath, dirnames, filenames in os.walk(docs):
        dirnames.sort()
        pages += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".md")]
    index = os.path.join(docs, "README.md")
    linked_from_index = set()

    for page in pages:
        rel = os.path.relpath(page, root)
        with open(page, encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        if page == os.path.join(root, "README.md") and len(lines) - 1 > README_MAX_LINES:
            problems.append(f"{rel}: {len(lines) - 1} lines, more than {README_MAX_LINES}")
        if page.startswith(docs + os.sep) and not lines[0].startswith("> For "):
            problems.append(f"{rel}:1: the first line must say who the page is for (\"> For ...\")")
        for number, target in links_of(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # another site, mailto:
            path_part, _, anchor = target.partition("#")
            dest = page if path_part == "" else os.path.normpath(
                os.path.join(os.path.dirname(page), path_part))
            if not os.path.exists(dest):
                problems.append(f"{rel}:{number}: broken link {target} (no {os.path.relpath(dest, root)})")
                continue
            if page == index and dest.endswith(".md"):
                linked_from_index.add(dest)
            if anchor:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append(f"{rel}:{number}: anchor on a non-Markdown target {target}")
                elif anchor not in anchors_of(dest):
                    problems.append(f"{rel}:{number}: missing anchor {target} "
                                    f"(no such heading in {os.path.relpath(dest, root)})")
        for i, line in enumerate(lines):
            m = DIAGRAM.match(line)
            if not m:
                continue
            source = os.path.normpath(os.path.join(os.path.dirname(page), m.group(1)))
            if not os.path.isfile(source):
                problems.append(f"{rel}:{i + 1}: diagram source {m.group(1)} does not exist")
                continue
            if i + 1 >= len(lines) or lines[i + 1].strip() != "```mermaid":
                problems.append(f"{rel}:{i + 1}: a diagram marker must precede a ```mermaid block")
                continue
            end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
            inline = "\n".join(lines[i + 2:end]).strip("\n") if end else None
            with open(source, encoding="utf-8") as f:
                if end is None or inline != f.read().strip("\n"):
                    problems.append(f"{rel}:{i + 1}: the inline diagram differs from {m.group(1)}")

    if not os.path.isfile(index):
        problems.append("docs/README.md: missing (the index of the docs)")
    else:
        for page in pages:
            if page.startswith(docs + os.sep) and page != index and page not in linked_from_index:
                problems.append(f"{os.path.relpath(page, root)}: not linked from docs/README.md")
    return problems


def self_test():
    """Each rule on a scratch tree: a good tree passes, and each defect is reported."""
    import shutil
    import tempfile

    def tree(files):
        root = tempfile.mkdtemp(prefix="check-docs-")
        for name, text in files.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return root

    good = {
        "README.md": "# P\n\n[docs](docs/README.md), [a](docs/A.md#two-words)\n",
        "docs/README.md": "> For everyone\n\n# Index\n\n[A](A.md)\n",
        "docs/A.md": "> For operators\n\n# A\n\n## Two words\n\n[up](../README.md#p)\n"
                     "<!-- diagram: d.mmd -->\n```mermaid\nflowchart LR\n  x --> y\n```\n",
        "docs/d.mmd": "flowchart LR\n  x --> y\n",
    }
    cases = {
        "a good tree": ({}, None),
        "a broken link": ({"README.md": "# P\n\n[docs](docs/README.md) [x](docs/NOPE.md)\n"}, "broken link docs/NOPE.md"),
        "a missing anchor": ({"README.md": "# P\n\n[docs](docs/README.md) [a](docs/A.md#three)\n"}, "missing anchor docs/A.md#three"),
        "a page not in the index": ({"docs/B.md": "> For operators\n\n# B\n"}, "docs/B.md: not linked from docs/README.md"),
        "a page without its reader": ({"docs/README.md": "> For everyone\n\n[A](A.md) [B](B.md)\n", "docs/B.md": "# B\n"}, "docs/B.md:1: the first line"),
        "a diagram out of date": ({"docs/d.mmd": "flowchart LR\n  x --> z\n"}, "the inline diagram differs"),
        "a long README": ({"README.md": "# P\n\n[docs](docs/README.md) [a](docs/A.md)\n" + "x\n" * 300}, "more than 300"),
    }
    failed = 0
    for name, (change, expected) in cases.items():
        root = tree({**good, **change})
        problems = check(root)
        shutil.rmtree(root)
        ok = (not problems) if expected is None else any(expected in p for p in problems)
        print(f"self-test: {name}: {'ok' if ok else 'WRONG'} {problems if not ok else ''}".rstrip())
        failed += not ok
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-docs: {len(problems)} problem(s)")
        return 1
    print("check-docs: README.md and docs/: every link, anchor, index entry and diagram ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
