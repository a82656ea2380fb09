#!/usr/bin/env python3
"""A performance model of the tensor-core kernels for docs/perf.md's GPU cases, before a GPU.

For each case it counts what the kernels do (bytes of K/V read, HMMAs issued, CTAs and the
chunks each one runs through the plain and the masked loop: attention_mma.cuh's schedule,
replayed here) and takes the instructions per pass of each loop from the kernel's SASS
(sass_loops.py). Three bounds follow on the declared device:
  memory  K/V bytes / copy bandwidth
  tensor  HMMA FLOPs / the dense 16-bit tensor peak
  issue   instructions / (SMs x 4 schedulers x clock x e), e the share of issue slots a
          FlashAttention-2 loop fills on that device (calibrated from a measured FA2 run)
and the estimate is the largest, with the bound it hits. No latency, occupancy tail or cache
effects beyond these: it ranks designs and names the bound; the device's figures judge.

  model.py [--cuobjdump PATH] SASS   (a plugin or cubin built for sm_90a, or a saved
                                     cuobjdump -sass listing)
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_loops  # noqa: E402

# H100 SXM: datasheet peaks, the copy bandwidth and FA2 (SDPA flash) figures measured on the
# project's H100 run of 2026-11-22 (docs/perf.md).
H100 = dict(name="H100 SXM", sms=132, clock=1.98e9, copy_bw=2.93e12, hbm_bw=3.35e12,
            tensor=989e12, fa2_ms=1.71, fa2_instr_per_hmma=4.3)
HMMA_FLOP = 2 * 16 * 8 * 16


def loop_counts(listing, kernel_re):
    """(plain, masked) instructions per pass of the kernel's innermost HMMA loops, and the
    HMMAs per pass: the main (plain) loop and the costliest other one (masked; the unaligned
    loop costs the same order and is not taken on aligned caches)."""
    for name, body in sass_loops.functions(listing):
        if not re.search(kernel_re, name):
            continue
        ranges = []
        for lo, hi in sass_loops.loops(body):
            c = sass_loops.count(body, lo, hi)
            if c["HMMA"]:
                ranges.append((lo, hi, c))
        inner = [r for r in ranges
                 if not any(o is not r and r[0] <= o[0] and o[1] <= r[1] and
                            (o[0], o[1]) != (r[0], r[1]) for o in ranges)]
        main = max(inner, key=lambda r: (r[2]["HMMA"], -r[2]["all"]))
        others = [r for r in inner if r is not main and r[2]["HMMA"] == main[2]["HMMA"]]
        masked = min(others, key=lambda r: r[2]["all"]) if others else main
        return main[2]["all"], masked[2]["all"], main[2]["HMMA"]
    sys.exit("model: no kernel matches %s" % kernel_re)


def decode_case(listing, b, ctx, hq, hkv, d, elem):
    chunk = 32 if d <= 128 else 16
    kt = "S1_" if elem == 2 else "NS_6e4m3_tE"
    plain, masked, hmma = loop_counts(listing, r"attention_mma_kernel.*bf16_tE%sLi%dELi1E" % (kt, d))
    ctas = b * hkv  # heads of a group (<= 8) per CTA
    chunks = -(-(ctx + 1) // chunk)
    full = (ctx + 1) // chunk  # every key visible: the plain loop; a partial tail is masked
    instr = ctas * (full * plain + (chunks - full) * masked)
    hm = ctas * chunks * hmma
    kv = b * (ctx + 1) * hkv * d * elem * 2
    return dict(bytes=kv, hmma=hm, instr=instr, ctas=ctas, useful_flop=4.0 * b * (ctx + 1) * hq * d)


def prefill_case(listing, b, n, hq, hkv, d):
    chunk = 64 if d <= 128 else 32
    plain, masked, hmma = loop_counts(listing, r"attention_mma_kernel.*bf16_tES1_Li%dELi4E" % d)
    group = hq // hkv
    hpc = min(group, 4)
    tile = 64 // hpc
    instr = hm = ctas = 0
    for t0 in range(0, n, tile):
        last = min(n, t0 + tile) - 1
        nchunks = -(-(last + 1) // chunk)
        plain_chunks = (t0 + 1) // chunk  # keys <= the tile's first token
        instr += plain_chunks * plain + (nchunks - plain_chunks) * masked
        hm += nchunks * hmma
        ctas += 1
    heads = hkv * -(-group // hpc)
    useful = b * hq * d * 4.0 * n * (n + 1) / 2
    kv = b * hkv * n * d * 2 * 2 * (-(-n // tile))  # every tile reads its keys (upper bound)
    warps = 4  # each runs the loop over its 16 rows
    return dict(bytes=kv, hmma=hm * b * heads * warps, instr=instr * b * heads * warps,
                ctas=ctas * b * heads, useful_flop=useful)


def estimate(dev, c, memory_bytes=None):
    issue_rate = dev["sms"] * 4 * dev["clock"]
    fa2_hmma = dev_fa2_hmma(dev)
    e = fa2_hmma * dev["fa2_instr_per_hmma"] / (dev["fa2_ms"] * 1e-3 * issue_rate)
    t = {
        "memory": (memory_bytes if memory_bytes is not None else c["bytes"]) / dev["copy_bw"],
        "tensor": c["hmma"] * HMMA_FLOP / dev["tensor"],
        "issue": c["instr"] / (issue_rate * e),
    }
    bound = max(t, key=t.get)
    return t, bound, e


def dev_fa2_hmma(dev):
    # FA2's HMMAs in the prefill case of the calibration: its causal FLOPs (SDPA's count).
    return 4 * 32 * 128 * 4.0 * 4096 * 4097 / 2 / HMMA_FLOP


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass")
    ap.add_argument("--cuobjdump")
    args = ap.parse_args()
    listing = sass_loops.read_listing(args.sass, args.cuobjdump)
    dev = H100
    rows = []
    dec = decode_case(listing, 64, 4095, 32, 8, 128, 2)
    rows.append(("decode b64 x 4096, 32/8 x 128 bf16", dec, None))
    dec8 = decode_case(listing, 64, 4095, 32, 8, 128, 1)
    rows.append(("decode b64 x 4096, fp8 e4m3 cache", dec8, None))
    dec16 = decode_case(listing, 16, 4095, 32, 8, 128, 2)
    rows.append(("decode b16 x 4096 bf16 (split-KV)", dec16, None))
    pre = prefill_case(listing, 4, 4096, 32, 8, 128)
    # Prefill's K/V come from L2 for all but the first tile of a sequence: DRAM reads each once.
    rows.append(("prefill 4 x 4096 causal, 32/8 x 128 bf16", pre, 4 * 4096 * 8 * 128 * 2 * 2))
    print("model: %s, %d SMs at %.2f GHz, copy %.2f TB/s, tensor %.0f TFLOP/s" %
          (dev["name"], dev["sms"], dev["clock"] / 1e9, dev["copy_bw"] / 1e12, dev["tensor"] / 1e12))
    for label, c, mem in rows:
        t, bound, e = estimate(dev, c, mem)
        est = max(t.values())
        line = "%-42s memory %.3f ms, tensor %.3f ms, issue %.3f ms -> %.3f ms (%s bound)" % (
            label, t["memory"] * 1e3, t["tensor"] * 1e3, t["issue"] * 1e3, est * 1e3, bound)
        if label.startswith("prefill"):
            line += "; %.0f TFLOP/s, %.2fx FA2's %.2f ms" % (
                c["useful_flop"] / est / 1e12, dev["fa2_ms"] / 1e3 / est, dev["fa2_ms"])
        else:
            line += "; %.0f%% of copy bandwidth" % (100 * t["memory"] / est)
        print(line)
    print("issue efficiency e = %.2f (FA2: %.1f instructions per HMMA in %.2f ms)" %
          (e, dev["fa2_instr_per_hmma"], dev["fa2_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
