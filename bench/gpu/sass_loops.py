#!/usr/bin/env python3
"""Static instruction counts of the tensor-core kernels' loops, from their SASS.

Reads `cuobjdump -sass` of a cubin, object or shared library (or a saved listing), finds each
kernel's loops (a backward branch closes one: its range runs from the target to the branch)
and prints, per kernel, its innermost loops that hold tensor-core instructions: how many
instructions of each class each range holds and how many that is per HMMA. The kernels of
attention_mma.cuh compile each run of chunks into its own loop (plain chunks, masked chunks,
and the unaligned-cache loop), so a loop's range is what a warp issues per pass of it; the
main loop is the innermost one with the most HMMAs, the fewest instructions on a tie (the
plain chunks' loop).

  sass_loops.py [--cuobjdump PATH] [--kernel REGEX] [--max-ratio R] [--all-loops] FILE

--kernel picks kernels by a regex on their mangled names; --max-ratio R exits 1 when a picked
kernel's main loop issues more than R instructions per HMMA. Exit 77 (a skip, for meson) when
no cuobjdump is found: it comes with the CUDA toolkit or the nvidia-cuda-cuobjdump wheel.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
FUNC = re.compile(r"Function : (\S+)")
BRANCH = re.compile(r"0x([0-9a-f]+)")

# Opcode families reported as their own columns; the rest are "other".
CLASSES = [
    ("HMMA", ("HMMA",)),
    ("LDSM", ("LDSM",)),
    ("LDGSTS", ("LDGSTS", "LDGDEPBAR", "DEPBAR")),
    ("LDG/STG", ("LDG", "STG")),
    ("LDS/STS", ("LDS", "STS")),
    ("MUFU", ("MUFU",)),
    ("F2F", ("F2F", "F2FP", "F2I", "I2F")),
    ("FMNMX", ("FMNMX",)),
    ("FP32", ("FADD", "FMUL", "FFMA", "FSEL", "FSETP", "FCHK")),
    ("INT", ("IMAD", "IADD3", "LEA", "SHF", "LOP3", "ISETP", "IABS", "IMNMX", "SEL", "MOV",
             "PRMT", "S2R", "S2UR", "ULDC", "UIADD3", "UMOV", "USHF", "ULOP3", "UISETP",
             "ULEA", "UIMAD", "R2UR", "IMAD.WIDE", "VIADD", "VIMNMX", "PLOP3", "P2R", "R2P",
             "I2FP", "IMUL", "POPC", "FLO", "BREV", "CS2R")),
    ("SHFL", ("SHFL",)),
    ("BAR", ("BAR", "WARPSYNC", "BSYNC", "BSSY")),
    ("BRA", ("BRA", "EXIT", "RET", "CALL", "JMP")),
]


def op_class(op):
    base = op.split(".")[0]
    for name, ops in CLASSES:
        if base in ops or op in ops:
            return name
    return "other"


def read_listing(path, cuobjdump):
    if path.endswith(".sass") or path.endswith(".txt"):
        with open(path) as f:
            return f.read()
    tool = cuobjdump or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.path.exists(tool) and not shutil.which(tool):
        print("sass_loops: skipped: no cuobjdump (the CUDA toolkit's or the "
              "nvidia-cuda-cuobjdump wheel's; or pass --cuobjdump)")
        sys.exit(77)
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True,
                          text=True).stdout


def functions(listing):
    """Yields (name, [(addr, op, operands)]) per kernel."""
    name, body = None, []
    for line in listing.splitlines():
        m = FUNC.search(line)
        if m:
            if name and body:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSTR.search(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(3), m.group(4)))
    if name and body:
        yield name, body


def loops(body):
    """(start, end) address ranges closed by backward branches."""
    out = []
    for addr, op, rest in body:
        if op.startswith("BRA"):
            m = BRANCH.search(rest)
            if m and int(m.group(1), 16) <= addr:
                out.append((int(m.group(1), 16), addr))
    return out


def count(body, lo, hi):
    c = collections.Counter()
    for addr, op, _ in body:
        if lo <= addr <= hi:
            c[op_class(op)] += 1
            c["all"] += 1
    return c


def short(name):
    """The kernel's name and template arguments, demangled where c++filt is installed."""
    if shutil.which("c++filt"):
        name = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    name = re.sub(r"^void |pagedattn_gpu::", "", name)
    name = re.sub(r"\(.*\)$", "", name)  # the parameters
    return name.replace(" ", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--kernel", default=".", help="regex on the mangled name")
    ap.add_argument("--max-ratio", type=float)
    ap.add_argument("--all-loops", action="store_true",
                    help="print the enclosing HMMA loops too, not only the innermost")
    args = ap.parse_args()
    listing = read_listing(args.file, args.cuobjdump)
    cols = ["all"] + [c for c, _ in CLASSES] + ["other"]
    print("%-52s %-12s " % ("kernel", "loop (*main)") + " ".join("%7s" % c for c in cols) + "  per HMMA")
    worst = 0.0
    seen = 0
    for name, body in functions(listing):
        if not re.search(args.kernel, name):
            continue
        ranges = []
        for lo, hi in loops(body):
            c = count(body, lo, hi)
            if c["HMMA"]:
                ranges.append((lo, hi, c))
        # Innermost: no other HMMA loop lies strictly inside.
        inner = [r for r in ranges
                 if not any(o is not r and r[0] <= o[0] and o[1] <= r[1] and
                            (o[0], o[1]) != (r[0], r[1]) for o in ranges)]
        if not inner:
            continue
        seen += 1
        main_loop = max(inner, key=lambda r: (r[2]["HMMA"], -r[2]["all"]))
        shown = sorted(ranges if args.all_loops else inner)
        for lo, hi, c in shown:
            ratio = c["all"] / c["HMMA"]
            tag = "%05x-%05x" % (lo, hi) + ("*" if (lo, hi) == main_loop[:2] else " ")
            print("%-52s %-12s " % (short(name)[:52], tag) +
                  " ".join("%7d" % c[k] for k in cols) + "  %.2f" % ratio)
        worst = max(worst, main_loop[2]["all"] / main_loop[2]["HMMA"])
    if not seen:
        sys.exit("sass_loops: no kernel with an HMMA loop matched")
    if args.max_ratio is not None and worst > args.max_ratio:
        print("sass_loops: a main loop issues %.2f instructions per HMMA (limit %.2f)" %
              (worst, args.max_ratio))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
