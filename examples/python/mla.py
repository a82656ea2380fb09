#!/usr/bin/env python3
"""One multi-head latent attention (MLA) decode step from Python, DeepSeek-V3-like: 16 query
heads (one tensor-parallel shard of 128), latent rows of 576 = 512 (kv_lora_rank) + 64 (rotary
key), blocks of 64 tokens, bfloat16.

Four sequences already have 300, 17, 1000 and 64 tokens in a latent cache (shuffled block
tables); this step writes each one's new row with write_latent (vLLM's concat_and_cache_mla),
runs forward_mla in the absorbed form (q_nope already multiplied by W_UK, plus q_pe) and checks
the output against a float64 numpy reference.

Run from the repository root after building:
    PAGEDATTN_LIB_DIR=build/lib /usr/bin/python3 examples/python/mla.py [backend]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bindings", "python"))
import pagedattn as pa  # noqa: E402  (after the path set-up for running from a checkout)

NUM_HEADS, KV_LORA_RANK, ROPE_DIM = 16, 512, 64
ROW = KV_LORA_RANK + ROPE_DIM  # 576
BLOCK_SIZE = 64
CONTEXT_LENS = [300, 17, 1000, 64]
# DeepSeek V3's softmax scale: mscale^2 / sqrt(qk_nope_head_dim + qk_rope_head_dim), with
# mscale = 0.1 * ln(40) + 1 (YaRN, factor 40).
SCALE = (0.1 * np.log(40.0) + 1.0) ** 2 / np.sqrt(128 + 64)
TOLERANCE = 2e-2  # bfloat16


def main() -> int:
    backend_name = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    rng = np.random.default_rng(2024)
    n = len(CONTEXT_LENS)
    print(f"pagedattn {pa.version_string()}, backend {backend_name}")

    with pa.Backend(backend_name) as backend:
        caps = backend.capabilities
        if caps.device_type != 1:
            print(f"backend {backend.name} does not compute on the host; this example uses numpy")
            return 1
        if pa.Feature.MLA not in caps.features or ROW not in caps.latent_sizes:
            print(f"backend {backend.name} has no MLA with rows of {ROW}")
            return 1

        # Shuffled block tables, each sized for the sequence with this step's token.
        need = [(c + 1 + BLOCK_SIZE - 1) // BLOCK_SIZE for c in CONTEXT_LENS]
        num_blocks = sum(need) + 8
        free = [int(b) for b in rng.permutation(num_blocks)]
        tables = []
        for k in need:
            tables.append(free[:k])
            free = free[k:]

        # Every latent row of every sequence (context plus the new token), rounded to bfloat16.
        rows = [pa.to_bfloat16(rng.uniform(-1, 1, (c + 1, ROW)).astype(np.float32))
                for c in CONTEXT_LENS]
        rows64 = [r.to_float32().astype(np.float64) for r in rows]

        def slot(s: int, pos: int) -> int:
            return tables[s][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE

        with pa.KVCache(backend, num_layers=1, num_blocks=num_blocks, block_size=BLOCK_SIZE,
                        num_kv_heads=1, head_size=ROW, dtype=pa.Dtype.BFLOAT16,
                        latent=True) as cache:
            # Earlier steps stored the context: kv_c [T, 512] and k_pe [T, 1, 64], vLLM's shapes.
            ctx = np.concatenate([r.array[:c] for r, c in zip(rows, CONTEXT_LENS)])
            ctx_slots = [slot(s, p) for s, c in enumerate(CONTEXT_LENS) for p in range(c)]
            cache.write_latent(0, pa.BFloat16Array(np.ascontiguousarray(ctx[:, :KV_LORA_RANK])),
                               pa.BFloat16Array(np.ascontiguousarray(
                                   ctx[:, KV_LORA_RANK:]).reshape(-1, 1, ROPE_DIM)),
                               ctx_slots)

            # This step: each sequence's new row goes in first (whole rows, k_pe None), then
            # the attention reads it with the context.
            new = pa.BFloat16Array(np.stack([r.array[c] for r, c in zip(rows, CONTEXT_LENS)]))
            cache.write_latent(0, new, None, [slot(s, c) for s, c in enumerate(CONTEXT_LENS)])
            q = pa.to_bfloat16(rng.uniform(-1, 1, (n, NUM_HEADS, ROW)).astype(np.float32))
            q_nope = pa.BFloat16Array(np.ascontiguousarray(q.array[:, :, :KV_LORA_RANK]))
            q_pe = pa.BFloat16Array(np.ascontiguousarray(q.array[:, :, KV_LORA_RANK:]))
            with pa.Batch(backend, cache, query_lens=[1] * n, context_lens=CONTEXT_LENS,
                          block_tables=tables) as batch:
                out, lse = pa.forward_mla(backend, batch, cache, 0, q_nope, q_pe,
                                          scale=float(SCALE), lse=True)

    got = out.to_float32().astype(np.float64)
    print(f"out: {got.shape[0]} tokens x {got.shape[1]} heads x {got.shape[2]} values (bfloat16)")

    # float64 reference: each key's row is the key (all 576 values) and the value (first 512).
    q64 = q.to_float32().astype(np.float64)
    max_err = max_ref = max_lse_err = 0.0
    for s in range(n):
        keys = rows64[s]                      # [context + 1, 576]
        sc = keys @ q64[s].T * SCALE          # [keys, heads]
        m = sc.max(axis=0)
        p = np.exp(sc - m)
        ref = (p.T @ keys[:, :KV_LORA_RANK]) / p.sum(axis=0)[:, None]
        max_err = max(max_err, float(np.abs(ref - got[s]).max()))
        max_ref = max(max_ref, float(np.abs(ref).max()))
        max_lse_err = max(max_lse_err, float(np.abs(m + np.log(p.sum(axis=0)) - lse[s]).max()))
    rel = max_err / max_ref
    print(f"max relative error {rel:.3g} (bfloat16 tolerance {TOLERANCE:g}); "
          f"max |lse - ref| {max_lse_err:.3g}")
    if not rel <= TOLERANCE or not max_lse_err <= 1e-3:
        print("FAILED: output differs from the float64 reference", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pa.PagedAttnError as e:
        print(f"pagedattn error: {e.code.c_name}: {e.message}", file=sys.stderr)
        sys.exit(1)
