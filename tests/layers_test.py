#!/usr/bin/python3
"""The dependency rules of docs/architecture.md, checked on the sources: a folder includes headers
only from the project folders its row of the "Parts and dependencies" table names (and common/,
which every part may use), and a part of service/ includes only the parts of service/ its row of
the "Parts of service/" table names. What a row names after "tests:" only its tests may include
(foo_test.cc, a *_test_util.h). The tables are the rule: a new dependency is a change to a table.

  tests/layers_test.py [SOURCE_DIR]
"""
import os
import re
import sys

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.path.join(os.path.dirname(__file__), ".."))
# Folders that may use any part: programs that print figures, and test drivers.
ANYTHING = {"bench", "tests"}


SERVICE_TABLE = "\n### Parts of service/"


def table_rows(section):
    """{folder: its "depends on" cell} for the rows of the first table in `section`."""
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([a-z_]+)/` \|.*\| ([^|]*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def architecture():
    with open(os.path.join(SRC, "docs/architecture.md"), encoding="utf-8") as f:
        return f.read()


def allowed_from_table():
    """{folder: set of project folders it may include}, from docs/architecture.md."""
    section = architecture().split("## Parts and dependencies", 1)[1].split("\n## ", 1)[0]
    rows = table_rows(section.split(SERVICE_TABLE, 1)[0])
    if not rows:
        sys.exit("layers_test: docs/architecture.md has no parts table")
    folders = set(rows)
    allowed, tests_only = {}, {}
    for folder, deps in rows.items():
        deps, _, for_tests = deps.partition("tests:")
        words = set(re.findall(r"[a-z_]+", deps))
        allowed[folder] = {folder, "common"} | (words & folders)
        if "everything" in words:
            allowed[folder] = set(folders)
        tests_only[folder] = set(re.findall(r"[a-z_]+", for_tests)) & folders
    return allowed, tests_only


def is_test(path):
    """A test's source (foo_test.cc, a test utility header): what "tests:" in a row allows."""
    name = os.path.basename(path)
    return re.search(r"(_test|_test_util)\.(cc|h|c)$", name) is not None


def service_parts():
    """{part: set of service/ parts it may include}, from docs/architecture.md."""
    text = architecture()
    if SERVICE_TABLE not in text:
        sys.exit("layers_test: docs/architecture.md has no table of service/'s parts")
    rows = table_rows(text.split(SERVICE_TABLE, 1)[1].split("\n## ", 1)[0])
    return {part: {part} | (set(re.findall(r"[a-z_]+", deps)) & set(rows))
            for part, deps in rows.items()}


def includes(folder, pattern=r'\s*#\s*include\s+"([a-z_]+)/'):
    """(file, line number, included folder) for every project include under `folder`."""
    root = os.path.join(SRC, folder)
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith((".h", ".cc", ".c", ".hpp", ".cpp")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = re.match(pattern, line)
                    if m:
                        yield os.path.relpath(path, SRC), n, m.group(1)


def main():
    allowed, tests_only = allowed_from_table()
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
            if dep in allowed and dep not in allowed[folder] and not (
                    is_test(path) and dep in tests_only[folder]):
                wrong.append(f"{path}:{n}: {folder}/ includes {dep}/, which its row of "
                             f"docs/architecture.md does not list "
                             f"(it may use {', '.join(sorted(allowed[folder]))})")
    parts = service_parts()
    service_dirs = sorted(d for d in os.listdir(os.path.join(SRC, "service"))
                          if os.path.isdir(os.path.join(SRC, "service", d)))
    for part in service_dirs:
        if part not in parts:
            wrong.append(f"service/{part}/ has no row in docs/architecture.md's table of "
                         f"service/'s parts")
            continue
        for path, n, dep in includes(f"service/{part}",
                                     r'\s*#\s*include\s+"service/([a-z_]+)/'):
            if dep not in parts[part]:
                wrong.append(f"{path}:{n}: service/{part}/ includes service/{dep}/, which its "
                             f"row of docs/architecture.md does not list "
                             f"(it may use {', '.join(sorted(parts[part]))})")
    for w in wrong:
        print(w)
    print(f"layers: {len(code_folders)} folders and {len(service_dirs)} parts of service/ "
          f"checked, {len(wrong)} rule(s) broken")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
