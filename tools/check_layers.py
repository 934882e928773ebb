#!/usr/bin/env python3
"""check_layers.py - check that pagellm's libraries call each other only as the layers allow.

    tools/check_layers.py [--nm NM] [ARCHIVE...]     (default: build/lib*.a)
    tools/check_layers.py --table                    print the layer table and exit

The table is configure.py's LAYERS (which library may call which), NARROW_EDGES (edges allowed
for some symbols only) and EXPORT_PREFIXES (the names a library may export). For every archive
lib<name>.a this runs `nm`, takes each object's undefined symbols, finds the library that
defines each one (its strong definition, else a weak one; symbols no archive defines come from
the system and are skipped) and fails, exit status 1, on:

  - a call along an edge the table does not allow: upward (kernels -> engine), sideways
    (scheduler -> models), or a narrowed edge outside its symbols; the message names the edge,
    the calling library and object, the symbol, and where it is defined;
  - a symbol defined (not weak) in two libraries: the linker would take whichever comes first;
  - an exported symbol without its library's prefix (every tokenizer export starts with tok_);
  - inside a library with a PART_ORDER row (engine), a part (source file) calling a part
    listed before it, or a part missing from the row;
  - an archive whose name is not in the table.

Otherwise it prints the edges in use and exits 0. Exit status 2: bad usage, no archives, or nm
failed. Python 3 standard library only; nm is binutils' (or --nm / $NM).
"""

import argparse
import fnmatch
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
sys.path.insert(0, ROOT)
import configure  # noqa: E402  (the table lives there, as data)

# nm -P: "archive[member]: name type [value size]"
NM_LINE = re.compile(r"^(?P<archive>.*)\[(?P<member>[^\]]*)\]: (?P<name>\S+) (?P<type>\S)")
WEAK = set("WV")


class Usage(Exception):
    pass


def nm(tool, archive, *flags):
    """[(member, symbol, type)] from `nm -P -A FLAGS archive`."""
    cmd = [tool, "-P", "-A"] + list(flags) + [archive]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
    except OSError as err:
        raise Usage("cannot run %s: %s (Debian package binutils)" % (tool, err))
    if proc.returncode != 0:
        raise Usage("%s failed on %s:\n%s" % (" ".join(cmd), archive, proc.stderr.strip()))
    out = []
    for line in proc.stdout.splitlines():
        m = NM_LINE.match(line)
        if m:
            out.append((m.group("member"), m.group("name"), m.group("type")))
    return out


def library_name(archive):
    base = os.path.basename(archive)
    if not (base.startswith("lib") and base.endswith(".a")):
        raise Usage("%s: not a lib<name>.a archive" % archive)
    return base[3:-2]


def table():
    uses = {lib: list(deps) for lib, _, deps in configure.LAYERS}
    return uses, configure.NARROW_EDGES, configure.EXPORT_PREFIXES


def print_table():
    uses, narrow, prefixes = table()
    print("layer table (configure.py LAYERS, lowest first): library, folders -> what it may call")
    for lib, folders, deps in configure.LAYERS:
        kind = "build/pagellm" if lib == configure.PROGRAM else "lib%s.a" % lib
        parts = []
        for dep in deps:
            only = narrow.get((lib, dep))
            parts.append(dep + (" (%s only)" % ", ".join(only) if only else ""))
        print("  %-18s %-25s -> %s" % (kind, " ".join(f + "/" for f in folders),
                                       ", ".join(parts) or "(nothing)"))
    for lib, pre in sorted(prefixes.items()):
        print("  every symbol lib%s.a exports starts with %s" % (lib, " or ".join(pre)))


def check(archives, tool):
    """Returns (problems: [str], edges: {(user, dep): set of symbols}, libraries checked)."""
    uses, narrow, prefixes = table()
    problems = []
    libs = {}
    for archive in archives:
        name = library_name(archive)
        if name not in uses or name == configure.PROGRAM:
            problems.append("%s: library %r is not in configure.py's LAYERS table (known: %s)"
                            % (rel(archive), name,
                               ", ".join(l for l in uses if l != configure.PROGRAM)))
            continue
        if name in libs:
            raise Usage("two archives for library %s: %s and %s"
                        % (name, rel(libs[name]), rel(archive)))
        libs[name] = archive

    strong, weak = {}, {}  # symbol -> [(library, member)]
    undefined = {}  # library -> [(member, symbol)]
    for name, archive in libs.items():
        for member, sym, kind in nm(tool, archive, "-g", "--defined-only"):
            (weak if kind in WEAK else strong).setdefault(sym, []).append((name, member))
            pre = prefixes.get(name)
            if pre and not sym.startswith(tuple(pre)) and not reserved(sym):
                problems.append(
                    "%s(%s) exports %s: every symbol of lib%s.a must start with %s (rename it "
                    "or make it static)" % (rel(archive), member, sym, name, " or ".join(pre)))
        undefined[name] = [(m, s) for m, s, _ in nm(tool, archive, "-u")]

    for sym, where in sorted(strong.items()):
        owners = sorted({lib for lib, _ in where})
        if len(owners) > 1 and not reserved(sym):
            problems.append("%s is defined in %s: one definition per symbol, or the link "
                            "order decides which one runs" % (sym, " and ".join(
                                "%s(%s)" % (rel(libs[lib]), m) for lib, m in where)))

    edges = {}
    bad = {}  # (user, dep) -> [lines]
    for user in libs:
        for member, sym in undefined[user]:
            where = strong.get(sym) or weak.get(sym)
            if where and any(lib == user for lib, _ in where):
                problems += part_problem(libs[user], user, member, sym,
                                         [m for lib, m in where if lib == user][0])
            if not where or any(lib == user for lib, _ in where):
                continue  # from the system, or defined in the same library
            dep, dep_member = where[0]
            only = narrow.get((user, dep))
            if dep in uses[user] and (not only or any(fnmatch.fnmatchcase(sym, p)
                                                      for p in only)):
                edges.setdefault((user, dep), set()).add(sym)
                continue
            bad.setdefault((user, dep), []).append(
                "    %s(%s) calls %s, defined in %s(%s)"
                % (rel(libs[user]), member, sym, rel(libs[dep]), dep_member))
    for (user, dep), lines in sorted(bad.items()):
        allowed = ", ".join(d + (" (%s only)" % ", ".join(narrow[(user, d)])
                                 if (user, d) in narrow else "")
                            for d in uses[user]) or "nothing"
        if (user, dep) in narrow:
            why = "%s -> %s is allowed only for %s" % (user, dep, ", ".join(narrow[(user, dep)]))
        elif reaches(uses, dep, user):
            why = "%s -> %s is a reversed edge: %s is below %s" % (user, dep, user, dep)
        elif reaches(uses, user, dep):
            why = "%s -> %s skips a layer: %s may reach %s only through what it calls" % (
                user, dep, user, dep)
        else:
            why = "%s -> %s is a sideways edge: neither layer is below the other" % (user, dep)
        problems.append("forbidden edge %s (%s may call: %s)\n%s"
                        % (why, user, allowed, "\n".join(sorted(set(lines)))))
    return problems, edges, libs


def part_problem(archive, lib, member, sym, dep_member):
    """[problem] when, inside lib, member calls sym of dep_member against PART_ORDER."""
    order = configure.PART_ORDER.get(lib)
    if not order:
        return []
    user, dep = (os.path.splitext(m)[0] for m in (member, dep_member))
    for part in (user, dep):
        if part not in order:
            return ["%s(%s.o): part %s of lib%s.a is not in configure.py's PART_ORDER[%r]"
                    % (rel(archive), part, part, lib, lib)]
    if order.index(user) >= order.index(dep):
        return ["%s(%s.o) calls %s, defined in %s.o: part %s may call only the parts below it "
                "in PART_ORDER[%r] (%s)" % (rel(archive), user, sym, dep, user, lib,
                                            " > ".join(order))]
    return []


def reserved(sym):
    """A name the compiler or a sanitizer makes (__odr_asan.x for each global x under ASan):
    C reserves names beginning with two underscores for the implementation."""
    return sym.startswith("__")


def reaches(uses, a, b):
    """Can library a call b, directly or through others?"""
    seen, todo = set(), [a]
    while todo:
        x = todo.pop()
        if x == b:
            return True
        if x not in seen:
            seen.add(x)
            todo += uses.get(x, [])
    return False


def rel(path):
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def main(argv):
    parser = argparse.ArgumentParser(
        prog="check_layers.py",
        description="Check pagellm's static libraries against the layer table in configure.py.")
    parser.add_argument("archives", nargs="*", metavar="ARCHIVE",
                        help="lib<name>.a files (default: build/lib*.a)")
    parser.add_argument("--nm", default=os.environ.get("NM", "nm"), help="nm to run")
    parser.add_argument("--table", action="store_true", help="print the layer table and exit")
    args = parser.parse_args(argv)
    if args.table:
        print_table()
        return 0
    archives = args.archives or sorted(glob.glob(os.path.join(ROOT, "build", "lib*.a")))
    try:
        if not archives:
            raise Usage("no build/lib*.a: build first (./configure.py && ninja)")
        problems, edges, libs = check(archives, args.nm)
    except Usage as err:
        sys.stderr.write("check_layers: error: %s\n" % err)
        return 2
    if problems:
        for p in problems:
            print("check_layers: FAIL: " + p)
        print("check_layers: %d problem(s) in %d libraries; the table is configure.py's "
              "LAYERS (docs/ARCHITECTURE.md, Layers)" % (len(problems), len(libs)))
        return 1
    order = [lib for lib, _, _ in configure.LAYERS]
    print("check_layers: OK: %d libraries (%s), every call along an allowed edge:"
          % (len(libs), " ".join(sorted(libs, key=order.index))))
    for (user, dep), syms in sorted(edges.items(),
                                    key=lambda e: (order.index(e[0][0]), order.index(e[0][1]))):
        print("  %-12s -> %-12s %3d symbol(s)" % (user, dep, len(syms)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
