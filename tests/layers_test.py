#!/usr/bin/python3
"""The dependency rules of docs/architecture.md, checked on the sources: a folder includes headers
only from the project folders its row of the "Parts and dependencies" table names (and common/,
which every part may use). The table is the rule: a new dependency is a change to the table.

  tests/layers_test.py [SOURCE_DIR]
"""
import os
import re
import sys

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.path.join(os.path.dirname(__file__), ".."))
# Folders that may use any part: programs that print figures, and test drivers.
ANYTHING = {"bench", "tests"}


def allowed_from_table():
    """{folder: set of project folders it may include}, from docs/architecture.md."""
    with open(os.path.join(SRC, "docs/architecture.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Parts and dependencies", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([a-z_]+)/` \|.*\| ([^|]*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    if not rows:
        sys.exit("layers_test: docs/architecture.md has no parts table")
    folders = set(rows)
    allowed = {}
    for folder, deps in rows.items():
        words = set(re.findall(r"[a-z_]+", deps))
        allowed[folder] = {folder, "common"} | (words & folders)
        if "everything" in words:
            allowed[folder] = set(folders)
    return allowed


def includes(folder):
    """(file, line number, included folder) for every project include under `folder`."""
    root = os.path.join(SRC, folder)
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith((".h", ".cc", ".c", ".hpp", ".cpp")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([a-z_]+)/', line)
                    if m:
                        yield os.path.relpath(path, SRC), n, m.group(1)


def main():
    allowed = allowed_from_table()
    code_folders = sorted(d for d in os.listdir(SRC)
                          if os.path.isfile(os.path.join(SRC, d, "CMakeLists.txt")))
    wrong = []
    for folder in code_folders:
        if folder in ANYTHING:
            continue
        if folder not in allowed:
            wrong.append(f"{folder}/ has no row in docs/architecture.md's parts table")
            continue
        for path, n, dep in includes(folder):
            if dep in allowed and dep not in allowed[folder]:
                wrong.append(f"{path}:{n}: {folder}/ includes {dep}/, which its row of "
                             f"docs/architecture.md does not list "
                             f"(it may use {', '.join(sorted(allowed[folder]))})")
    for w in wrong:
        print(w)
    print(f"layers: {len(code_folders)} folders checked, {len(wrong)} rule(s) broken")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
