#!/usr/bin/env python3
"""Compares the dynamic symbols libpagedattn.so defines with the committed list.

    check_symbols.py LIBRARY SYMBOLS_TXT            check (exit 1 on any addition or removal)
    check_symbols.py --update LIBRARY SYMBOLS_TXT   rewrite the list (an intended change)

The list holds "TYPE NAME" lines from `nm -D --defined-only` (T = function, D/B/R = data).
A removal or a changed type breaks callers; an addition is only allowed with a minor version
bump and must be committed deliberately, so both fail until the list is updated."""
import subprocess
import sys


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, name = parts[1], parts[2].split("@")[0]
        syms.add(f"{kind} {name}")
    return syms


def main(argv):
    update = "--update" in argv
    args = [a for a in argv[1:] if a != "--update"]
    if len(args) != 2:
        print(__doc__)
        return 2
    lib, listfile = args
    have = exported(lib)
    if update:
        with open(listfile, "w") as f:
            f.write("".join(s + "\n" for s in sorted(have, key=lambda s: s.split()[1])))
        print(f"abi: wrote {len(have)} symbols to {listfile}")
        return 0
    with open(listfile) as f:
        want = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    added, removed = sorted(have - want), sorted(want - have)
    for s in added:
        print(f"abi: ADDED   {s} (not in {listfile})")
    for s in removed:
        print(f"abi: REMOVED {s} (listed in {listfile}, not exported)")
    if added or removed:
        print("abi: the exported symbols changed. Removals break callers; additions need a minor "
              "version bump. If intended: tests/abi/check_symbols.py --update LIB "
              "tests/abi/symbols.txt")
        return 1
    print(f"abi: {len(have)} exported symbols match {listfile}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
