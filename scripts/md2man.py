#!/usr/bin/python3
"""Writes a man page (man(7) macros) from sections of the project's Markdown docs and from the
programs' own --help, so that the installed manual says what docs/ and the binaries say.

  md2man.py --name nopfs --section 1 --summary "..." --out nopfs.1 \
      --help "nopfs --help" --md docs/user.md:"The options","What your tasks see" ...

--md FILE includes the whole file (its '# title' dropped); FILE:"A","B" only the '## A' and '## B'
sections. Each included '## x' becomes a section (.SH), '### x' a subsection (.SS). --help CMD
runs CMD and includes its output verbatim under a section named by --help-title (repeatable, in
order with --md). The Markdown understood is what docs/ uses: paragraphs, '-' and '1.' lists,
fenced code, pipe tables (rendered as tagged paragraphs: first column as the tag), `code`,
**bold**, *emphasis* and [links](...). Anything else is passed through as text.
"""

import argparse
import datetime
import os
import re
import subprocess
import sys


def escape(text):
    """Escapes text for roff: backslashes, and a leading control character."""
    text = text.replace("\\", "\\e")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def inline(text):
    """Markdown inline markup to roff font changes."""
    text = text.replace("\\|", "|")
    out = []
    pos = 0
    # Code spans first: nothing inside them is markup.
    for m in re.finditer(r"`([^`]+)`", text):
        out.append(_emphasis(escape_inline(text[pos:m.start()])))
        out.append("\\fB" + escape_inline(m.group(1)).replace("-", "\\-") + "\\fR")
        pos = m.end()
    out.append(_emphasis(escape_inline(text[pos:])))
    return "".join(out)


def escape_inline(text):
    return text.replace("\\", "\\e")


def _emphasis(text):
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"\\fI\1\\fR", text)
    return text


def line(text):
    """One output text line: a leading control character is protected."""
    return "\\&" + text if text.startswith((".", "'")) else text


def split_row(row):
    cells = re.split(r"(?<!\\)\|", row.strip())
    if cells and cells[0] == "":
        cells = cells[1:]
    if cells and cells[-1] == "":
        cells = cells[:-1]
    return [c.strip() for c in cells]


def render(lines):
    """Markdown lines to roff lines."""
    out = []
    para = []
    i = 0

    def flush():
        if para:
            out.append(".PP")
            out.extend(line(inline(p)) for p in para)
            para.clear()

    while i < len(lines):
        raw = lines[i]
        s = raw.rstrip()
        if s.startswith("```"):
            flush()
            out += [".PP", ".RS 4", ".nf"]
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                out.append(line(escape_inline(lines[i].rstrip()).replace("-", "\\-")))
                i += 1
            out += [".fi", ".RE"]
            i += 1
            continue
        if s.startswith("### "):
            flush()
            out.append(".SS " + inline(s[4:]))
        elif s.startswith("## "):
            flush()
            out.append(".SH " + inline(s[3:]).upper())
        elif s.startswith("|"):
            flush()
            header = split_row(s)
            rows = []
            i += 1
            while i < len(lines) and lines[i].startswith("|"):
                if not re.fullmatch(r"\|[\s:|-]+\|?", lines[i].strip()):
                    rows.append(split_row(lines[i]))
                i += 1
            for row in rows:
                out.append(".TP")
                out.append(line(inline(row[0])) if row else "")
                body = inline(row[1]) if len(row) > 1 else ""
                extras = [f"{inline(h)}: {inline(c)}." for h, c in zip(header[2:], row[2:]) if c]
                out.append(line(" ".join([body + ("." if body and extras else "")] + extras)))
            continue
        elif re.match(r"^\s*([-*]|\d+\.) ", s):
            flush()
            m = re.match(r"^(\s*)([-*]|\d+\.) (.*)", s)
            indent = len(m.group(1))
            tag = "\\(bu" if m.group(2) in "-*" else m.group(2)
            item = [m.group(3)]
            i += 1
            # Continuation lines of the item (indented, not a new item or block).
            while i < len(lines) and lines[i].strip() and lines[i].startswith(" " * (indent + 2)) \
                    and not re.match(r"^\s*([-*]|\d+\.) ", lines[i]):
                item.append(lines[i].strip())
                i += 1
            if indent:
                out.append(".RS 4")
            out.append(f".IP {tag} 4")
            out.extend(line(inline(t)) for t in item)
            if indent:
                out.append(".RE")
            continue
        elif s == "":
            flush()
        elif s.startswith("<!--"):
            pass
        else:
            para.append(s.strip())
        i += 1
    flush()
    return out


def sections(path, wanted):
    """The lines of the '## ' sections named in `wanted` (all of the file if empty)."""
    with open(path, encoding="utf-8") as f:
        text = f.read().splitlines()
    if text and text[0].startswith("# "):
        text = text[1:]
    if not wanted:
        # Text before the first section describes the whole page.
        first = next((s for s in text if s.strip()), "")
        return text if first.startswith("## ") else ["## Description"] + text
    picked = []
    found = set()
    keep = False
    for s in text:
        if s.startswith("## "):
            keep = s[3:].strip() in wanted
            if keep:
                found.add(s[3:].strip())
        if keep:
            picked.append(s)
    missing = [w for w in wanted if w not in found]
    if missing:
        sys.exit(f"md2man: {path} has no section {', '.join(repr(m) for m in missing)}")
    return picked


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--section", required=True)
    ap.add_argument("--summary", required=True, help="the NAME line after 'name \\-'")
    ap.add_argument("--synopsis", action="append", default=[], help="a SYNOPSIS line")
    ap.add_argument("--version", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--md", action="append", default=[], dest="parts", type=lambda v: ("md", v))
    ap.add_argument("--help-cmd", action="append", default=[], dest="parts",
                    type=lambda v: ("help", v),
                    help="TITLE=COMMAND: its output, verbatim (+TITLE: a subsection)")
    ap.add_argument("--see-also", default="")
    ap.add_argument("--docdir", default="",
                    help="where docs/ is installed: every docs/NAME.md cited becomes DIR/NAME.md, "
                         "so that the page names files a node has")
    args = ap.parse_args()

    # SOURCE_DATE_EPOCH makes the date reproducible (Debian's packaging sets it).
    date = datetime.datetime.fromtimestamp(
        int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or datetime.datetime.now().timestamp(),
        datetime.timezone.utc).strftime("%Y-%m-%d")
    out = [f'.TH {args.name.upper()} {args.section} {date} "nopfs {args.version}" "nopfs"',
           ".SH NAME", f"{escape(args.name)} \\- {inline(args.summary)}"]
    if args.synopsis:
        out.append(".SH SYNOPSIS")
        for s in args.synopsis:
            out += [".PP", line(inline(s))]
    for kind, value in args.parts:
        if kind == "md":
            path, _, names = value.partition(":")
            wanted = [n.strip() for n in names.split(",") if n.strip()] if names else []
            out += render(sections(path, wanted))
        else:
            title, _, cmd = value.partition("=")
            text = subprocess.run(cmd, shell=True, check=True, capture_output=True,
                                  text=True).stdout
            text = re.sub(r"^Usage: \S*/", "Usage: ", text, flags=re.MULTILINE)
            # "+TITLE" makes a subsection of the section before it.
            head = ".SS " + title[1:] if title.startswith("+") else ".SH " + title.upper()
            out += [head, ".nf"]
            out += [line(escape_inline(t).replace("-", "\\-")) for t in text.splitlines()]
            out.append(".fi")
    if args.see_also:
        out += [".SH SEE ALSO", inline(args.see_also)]
    text = "\n".join(out) + "\n"
    if args.docdir:
        # After a word boundary, or right after a font change (\fB, \fI).
        text = re.sub(r"(?:(?<=\\f[BIR])|(?<![\w/.-]))docs/([\w.]+\.md)",
                      lambda m: f"{args.docdir}/{m.group(1)}", text)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
