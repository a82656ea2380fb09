#!/usr/bin/python3
"""Checks a GPU plugin without needing a GPU.

- it exports exactly pagedattn_plugin_abi_version and pagedattn_plugin_ops;
- it links its vendor runtime (libcudart / libamdhip64) and not the core;
- loaded through the core (PAGEDATTN_PLUGIN_PATH), the backend is either available, or
  unavailable with the runtime's reason ("cudaGetDeviceCount: ... (35)"), and creating it
  returns BACKEND_UNAVAILABLE with that reason, never crashes.
Usage: check_plugin.py NAME PLUGIN.so LIBPAGEDATTN.so
"""
import ctypes as C
import os
import subprocess
import sys

RUNTIME = {"cuda": "libcudart", "hip": "libamdhip64"}
OK, UNAVAILABLE = 0, 12


class Info(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("name", C.c_char_p), ("available", C.c_int32),
                ("reason", C.c_char_p)]


def main() -> int:
    name, plugin, core = sys.argv[1], sys.argv[2], sys.argv[3]
    fails = []
    nm = subprocess.run(["nm", "-D", "--defined-only", plugin], check=True, capture_output=True,
                        text=True).stdout
    syms = sorted(l.split()[-1].split("@")[0] for l in nm.splitlines()
                  if len(l.split()) >= 2 and l.split()[-2] != "A")
    print("exports:", syms)
    if syms != ["pagedattn_plugin_abi_version", "pagedattn_plugin_ops"]:
        fails.append("exports %s" % syms)
    dyn = subprocess.run(["readelf", "-d", plugin], check=True, capture_output=True,
                         text=True).stdout
    needed = [l.split("[")[1].rstrip("]") for l in dyn.splitlines() if "(NEEDED)" in l]
    print("needed:", needed)
    if not any(n.startswith(RUNTIME[name]) for n in needed):
        fails.append("does not link %s" % RUNTIME[name])
    if any(n.startswith("libpagedattn") for n in needed):
        fails.append("links the core")

    os.environ["PAGEDATTN_PLUGIN_PATH"] = os.path.dirname(os.path.abspath(plugin))
    lib = C.CDLL(core)
    lib.pagedattn_last_error.restype = C.c_char_p
    found = False
    for i in range(lib.pagedattn_backend_count()):
        info = Info(C.sizeof(Info))
        if lib.pagedattn_backend_get_info(C.byref(info), i) != OK:
            fails.append("get_info(%d) failed" % i)
            continue
        if info.name.decode() != name:
            continue
        found = True
        reason = info.reason.decode()
        print("%s: available=%d reason=%r" % (name, info.available, reason))
        be = C.c_void_p()
        st = lib.pagedattn_backend_create(C.byref(be), name.encode(), None)
        err = lib.pagedattn_last_error().decode()
        print("create: status %d: %r" % (st, err))
        if info.available:
            if st != OK:
                fails.append("available but create failed: %s" % err)
            lib.pagedattn_backend_destroy(be)
        else:
            if "GetDeviceCount" not in reason and "device" not in reason:
                fails.append("unavailable without the runtime's reason: %r" % reason)
            if st != UNAVAILABLE or reason not in err:
                fails.append("create: status %d, message %r" % (st, err))
    if not found:
        fails.append("backend %s not listed" % name)
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
