#!/usr/bin/env python3
"""One decode step over a paged KV cache from Python — the same step as examples/c/decode.c.

Three sequences already have 5, 17 and 40 tokens in the cache (non-contiguous block tables);
this step adds one token to each and runs the attention layer, then checks the output against a
float64 numpy reference. The inputs come from the C example's generator, so both print the same
numbers.

Run from the repository root after building:
    PAGEDATTN_LIB_DIR=build/lib /usr/bin/python3 examples/python/decode.py [backend]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bindings", "python"))
import pagedattn as pa  # noqa: E402  (after the path set-up for running from a checkout)

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 8, 2, 64
BLOCK_SIZE, NUM_BLOCKS = 16, 16
CONTEXT_LENS = [5, 17, 40]
BLOCK_TABLES = [[7], [2, 11], [9, 4, 13]]


class XorShift:
    """The C example's generator (xorshift32, seed 12345), value for value."""

    def __init__(self) -> None:
        self.state = 12345

    def uniform(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.float32)
        s = self.state
        for i in range(n):
            s ^= (s << 13) & 0xFFFFFFFF
            s ^= s >> 17
            s ^= (s << 5) & 0xFFFFFFFF
            out[i] = (s >> 8) / 16777216.0 * 2.0 - 1.0
        self.state = s
        return out


def main() -> int:
    backend_name = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    rng = XorShift()
    kv_row, q_row = NUM_KV_HEADS * HEAD_SIZE, NUM_HEADS * HEAD_SIZE
    keys, values, query = [], [], []
    for ctx in CONTEXT_LENS:
        # Per token, per element: the key then the value (the C example's order).
        kv = [rng.uniform(2 * kv_row) for _ in range(ctx + 1)]
        keys.append(np.stack([x[0::2] for x in kv]))
        values.append(np.stack([x[1::2] for x in kv]))
        query.append(rng.uniform(q_row))
    print(f"pagedattn {pa.version_string()}, backend {backend_name}")

    with pa.Backend(backend_name) as backend:
        if backend.capabilities.device_type != 1:
            print(f"backend {backend.name} does not compute on the host; this example uses numpy")
            return 1
        with pa.KVCache(backend, num_layers=1, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                        num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                        dtype=pa.Dtype.FLOAT32) as cache:
            # Earlier steps stored the context: slot = table[pos // bs] * bs + pos % bs.
            slots = [BLOCK_TABLES[s][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                     for s, ctx in enumerate(CONTEXT_LENS) for p in range(ctx)]
            ctx_k = np.concatenate([k[:c] for k, c in zip(keys, CONTEXT_LENS)])
            ctx_v = np.concatenate([v[:c] for v, c in zip(values, CONTEXT_LENS)])
            cache.write(0, ctx_k.reshape(-1, NUM_KV_HEADS, HEAD_SIZE),
                        ctx_v.reshape(-1, NUM_KV_HEADS, HEAD_SIZE), slots)

            # This step: one new token per sequence; planning validates the tables once.
            with pa.Batch(backend, cache, query_lens=[1, 1, 1], context_lens=CONTEXT_LENS,
                          block_tables=BLOCK_TABLES) as batch:
                q = np.stack(query).reshape(3, NUM_HEADS, HEAD_SIZE)
                k = np.stack([k[c] for k, c in zip(keys, CONTEXT_LENS)])
                v = np.stack([v[c] for v, c in zip(values, CONTEXT_LENS)])
                # lse=True: the result is the pair (out, lse), both numpy like q.
                out, lse = pa.forward(backend, batch, cache, 0, q,
                                      k.reshape(3, NUM_KV_HEADS, HEAD_SIZE),
                                      v.reshape(3, NUM_KV_HEADS, HEAD_SIZE), lse=True)

    for s, ctx in enumerate(CONTEXT_LENS):
        o = out[s, 0, :4]
        print(f"seq {s} (context {ctx:2d}): out[head 0][0..3] = "
              f"{o[0]:+.5f} {o[1]:+.5f} {o[2]:+.5f} {o[3]:+.5f}")

    # float64 reference: softmax(q.k / sqrt(D)) v over positions 0..context_len.
    max_err = max_ref = max_lse_err = 0.0
    group = NUM_HEADS // NUM_KV_HEADS
    for s in range(3):
        K = keys[s].astype(np.float64).reshape(-1, NUM_KV_HEADS, HEAD_SIZE)
        V = values[s].astype(np.float64).reshape(-1, NUM_KV_HEADS, HEAD_SIZE)
        for h in range(NUM_HEADS):
            sc = K[:, h // group, :] @ q[s, h].astype(np.float64) / np.sqrt(HEAD_SIZE)
            p = np.exp(sc - sc.max())
            ref = p @ V[:, h // group, :] / p.sum()
            max_err = max(max_err, float(np.abs(ref - out[s, h]).max()))
            max_ref = max(max_ref, float(np.abs(ref).max()))
            ref_lse = sc.max() + np.log(p.sum())
            max_lse_err = max(max_lse_err, abs(float(ref_lse) - float(lse[s, h])))
    rel = max_err / max_ref
    print(f"max |out - ref| / max |ref| = {rel:.3g} (float32 tolerance 1e-5)")
    print(f"max |lse - ref| = {max_lse_err:.3g} (tolerance 1e-5)")
    if not rel <= 1e-5 or not max_lse_err <= 1e-5:
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
