#!/usr/bin/env python3
"""Markdown table of pagedattn-bench --json records (one JSON object per line).

usage: bench/summarize.py records.jsonl
"""
import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    print("| mode | backend | thr | heads / kv | B x ctx / q | cache | layout | median ms [min, max] "
          "| GB/s (% bw, % plain block read) | GFLOP/s (% sgemm) | roofline | vs naive | tokens/s "
          "| cpu share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = 1 if r["mode"] in ("decode", "mla-decode") else r["query"]
        shape = "%d x %d / %d" % (r["batch"], r["context"], q)
        bw = "%.2f (%.0f%%)" % (r["bytes_per_s"] / 1e9, 100 * r["bw_ratio"]) if r["read_bw"] else \
            "%.2f" % (r["bytes_per_s"] / 1e9)
        if r.get("paged_read_bw"):
            bw = bw[:-1] + ", %.0f%%)" % (100 * r["paged_ratio"])
        fl = "-"
        if r["flops"] > 0:
            fl = "%.1f" % (r["flops_per_s"] / 1e9)
            if r["sgemm_flops"]:
                fl += " (%.0f%%)" % (100 * r["gemm_ratio"])
        roof = "%.0f%%" % (100 * r["roofline_ratio"]) if r.get("roofline_ratio") else "-"
        sp = "%.1fx" % r["speedup"] if r["baseline_iters"] > 0 else "-"
        backend = r["backend"]
        if r.get("cpu_target", "default") != "default":
            backend += " (%s)" % r["cpu_target"]
        heads = "%d / %d" % (r["heads"], r["kv_heads"])
        if r["mode"].startswith("mla"):  # one latent row of head_size values, value_size of them out
            heads = "%d / latent %d (R %d)" % (r["heads"], r["head_size"], r.get("value_size", 0))
        print("| %s | %s | %d | %s | %s | %s | %s | %.2f [%.2f, %.2f] | %s | %s | %s | %s | %.0f "
              "| %.0f%% |" % (
            r["mode"], backend, r["threads"], heads, shape, r["cache_dtype"], r["layout"],
            r["median_s"] * 1e3, r["min_s"] * 1e3, r["max_s"] * 1e3, bw, fl, roof, sp,
            r["tokens_per_s"], 100 * r.get("cpu_share", 0)))
    for r in rows:
        if r.get("scaling_rounds", 0) > 0:
            line = ("\n%s %s %s %s, %d rounds alternating 1 and %d threads, %d/1 throughput: "
                    "library call %.2fx (%.2f -> %.2f ms), register-only arithmetic %.2fx, "
                    "streaming read %.2fx") % (
                r["mode"], r["backend"], r["cache_dtype"], r["layout"], r["scaling_rounds"],
                r["threads"], r["threads"], r["scaling_lib"], r["scaling_t1_median_s"] * 1e3,
                r["scaling_tn_median_s"] * 1e3, r["scaling_core"], r["scaling_stream"])
            if r.get("scaling_paged", 0) > 0:
                line += ", plain block read %.2fx" % r["scaling_paged"]
            print(line)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
