#!/usr/bin/python3
"""Checks libpagedattn.so's dynamic symbols and dependencies.

- every defined dynamic symbol starts with pagedattn_ (version-node names, type A, excepted);
- no GPU runtime (libcuda, libcudart, libamdhip64, libhiprtc) and no oneDNN among NEEDED.
Usage: check_exports.py path/to/libpagedattn.so
"""
import re
import subprocess
import sys


def main() -> int:
    lib = sys.argv[1]
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                        capture_output=True, text=True).stdout
    bad, good = [], []
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if kind == "A":  # symbol-version definitions (e.g. PAGEDATTN_0)
            continue
        name = name.split("@")[0]
        (good if name.startswith("pagedattn_") else bad).append(name)
    print(f"{len(good)} exported pagedattn_* symbols")
    if not good:
        print("FAIL: no pagedattn_* symbol exported")
        return 1
    for needed in ("pagedattn_version", "pagedattn_forward", "pagedattn_kv_cache_create",
                   "pagedattn_batch_create", "pagedattn_merge_states"):
        if needed not in good:
            print(f"FAIL: {needed} is not exported")
            return 1
    if bad:
        print("FAIL: symbols outside the pagedattn_ namespace are exported:")
        for name in sorted(bad):
            print("   ", name)
        return 1

    dyn = subprocess.run(["readelf", "-d", lib], check=True, capture_output=True,
                         text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    print("NEEDED:", ", ".join(needed))
    forbidden = [n for n in needed
                 if re.match(r"lib(cuda|cudart|amdhip64|hiprtc|nvrtc|dnnl)\b", n)]
    if forbidden:
        print("FAIL: the core links a GPU runtime or oneDNN:", ", ".join(forbidden))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
