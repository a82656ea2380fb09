#!/usr/bin/env python3
"""From vLLM's or FlashInfer's attention metadata to a pagedattn batch, in Python.

An engine that fills vLLM's attention metadata or calls FlashInfer's plan() already holds every
number a pagedattn batch needs (docs/porting.md). Here each step's metadata is written the way
each of them holds it; from_vllm() and from_flashinfer() turn it into the keyword arguments of
pa.Batch / Batch.update, the two conversions are checked to agree, and the forward's output is
checked against a float64 reference:

  1. prefill: three prompts, nothing cached (a new Batch);
  2. decode: one token per sequence (the same Batch, update() with its default capacities);
  3. chunked prefill: new chunks after cached tokens, next to a decode (a prefix-cache hit
     is described the same way);
  4. cross attention (encoder-decoder): decoder queries over the encoder's keys, held in a
     cross cache through a second set of block tables.

Run from the repository root after building:
    PAGEDATTN_LIB_DIR=build/lib /usr/bin/python3 examples/python/porting.py
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bindings", "python"))
import pagedattn as pa  # noqa: E402  (after the path set-up for running from a checkout)

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 2, 1, 16  # GQA: both query heads share one KV head
BLOCK_SIZE, NUM_BLOCKS = 4, 32
MAX_BLOCKS = 4  # the engine's table width: sequences of up to 16 tokens
TOLERANCE = 1e-4


# ---- the conversions ---------------------------------------------------------------------

def from_vllm(seq_lens, query_start_loc, block_table, slot_mapping=None):
    """vLLM's FlashAttentionMetadata fields -> keyword arguments of pa.Batch / Batch.update."""
    query_start_loc = np.asarray(query_start_loc, dtype=np.int32)
    query_lens = np.diff(query_start_loc)  # num_seqs + 1 offsets -> one count per sequence
    # seq_lens includes this step's tokens; pagedattn wants the tokens cached BEFORE the step.
    # The classic mistake, context_lens = seq_lens, raises no error (every value is in range)
    # but shifts each query query_len positions late, onto keys that do not exist yet.
    context_lens = np.asarray(seq_lens, dtype=np.int32) - query_lens
    args = dict(query_lens=query_lens, context_lens=context_lens,
                block_tables=np.asarray(block_table, dtype=np.int32))  # padding is not read
    if slot_mapping is not None:
        # Optional: pagedattn computes the same slots from the tables. Pass vLLM's only where it
        # differs, e.g. -1 for padding tokens.
        args["slot_mapping"] = np.asarray(slot_mapping, dtype=np.int64)
    return args


def cross_from_vllm(encoder_seq_lens, cross_block_tables):
    """vLLM's encoder-decoder fields -> the cross attention arguments of pa.Batch."""
    return dict(encoder_lens=np.asarray(encoder_seq_lens, dtype=np.int32),
                cross_block_tables=np.asarray(cross_block_tables, dtype=np.int32))


def paged_kv(indptr, indices, last_page_len, page_size, width):
    """FlashInfer's CSR page list -> (tokens per sequence, block tables padded to width)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    pages = np.diff(indptr)
    # Full pages, then the last one's tokens; a sequence without pages holds no token.
    kv_lens = np.where(pages > 0, (pages - 1) * page_size + np.asarray(last_page_len), 0)
    tables = np.zeros((len(pages), width), dtype=np.int32)
    for i in range(len(pages)):
        tables[i, :pages[i]] = indices[indptr[i]:indptr[i + 1]]
    return kv_lens.astype(np.int32), tables


def from_flashinfer(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                    page_size, width=MAX_BLOCKS):
    """FlashInfer plan() arguments -> keyword arguments of pa.Batch / Batch.update."""
    query_lens = np.diff(np.asarray(qo_indptr, dtype=np.int32))
    kv_lens, tables = paged_kv(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                               page_size, width)
    # FlashInfer's pages already hold this step's tokens (append_paged_kv_cache ran first).
    return dict(query_lens=query_lens, context_lens=kv_lens - query_lens, block_tables=tables)


def cross_from_flashinfer(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                          page_size, width=MAX_BLOCKS):
    """The pages of a cross (non-causal) plan over the encoder -> pa.Batch's cross arguments.
    Their token count is the encoder length itself: no decoder token to subtract."""
    encoder_lens, tables = paged_kv(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                    page_size, width)
    return dict(encoder_lens=encoder_lens, cross_block_tables=tables)


def same_batch(a, b):
    """Whether two conversions describe the same batch (the optional slot_mapping aside)."""
    keys = ("query_lens", "context_lens", "block_tables", "encoder_lens", "cross_block_tables")
    return all((k in a) == (k in b) and (k not in a or np.array_equal(a[k], b[k])) for k in keys)


# ---- the model and the reference ---------------------------------------------------------

def tokens(rng, n, heads):
    """n tokens' vectors [n, heads, HEAD_SIZE], as a layer's projections would give them."""
    return rng.uniform(-1.0, 1.0, (n, heads, HEAD_SIZE)).astype(np.float32)


def attend(q, keys, values):
    """float64 softmax(q k^T / sqrt(D)) v of one token: q [H, D], keys/values [n, Hkv, D]."""
    out = np.empty(q.shape, dtype=np.float64)
    group = NUM_HEADS // NUM_KV_HEADS
    for h in range(NUM_HEADS):
        k = keys[:, h // group].astype(np.float64)
        v = values[:, h // group].astype(np.float64)
        s = k @ q[h].astype(np.float64) / np.sqrt(HEAD_SIZE)
        p = np.exp(s - s.max())
        out[h] = p @ v / p.sum()
    return out


def step_rows(Q, K, V, cached, new):
    """This step's positions per sequence and its q, k, v rows, sequence after sequence, as
    query_start_loc orders them."""
    pos = [range(c, c + n) for c, n in zip(cached, new)]
    q = np.concatenate([Q[s][list(p)] for s, p in enumerate(pos)])
    k = np.concatenate([K[s][list(p)] for s, p in enumerate(pos)])
    v = np.concatenate([V[s][list(p)] for s, p in enumerate(pos)])
    return pos, q, k, v


def causal_ref(Q, K, V, pos):
    """Causal self attention of those rows: the token at position t sees positions 0..t."""
    return np.stack([attend(Q[s][t], K[s][:t + 1], V[s][:t + 1])
                     for s, p in enumerate(pos) for t in p])


def check(name, out, expected):
    err = float(np.abs(out.astype(np.float64) - expected).max())
    print(f"{name}: max |out - ref| = {err:.2e}")
    if not err <= TOLERANCE:
        raise SystemExit(f"FAILED: {name}: output differs from the float64 reference "
                         f"({err:.3g} > {TOLERANCE:g})")


# ---- decoder steps: prefill, decode, chunked prefill -------------------------------------

# Each step as vLLM and FlashInfer hold it (block size 4; blocks allocated as sequences grow,
# in no particular order). `new` is the engine's own count of each sequence's new tokens.
SELF_STEPS = [
    dict(name="prefill", new=[5, 3, 7],
         vllm=dict(seq_lens=[5, 3, 7], query_start_loc=[0, 5, 8, 15],
                   block_table=[[13, 2, 0, 0], [5, 0, 0, 0], [22, 16, 0, 0]],
                   slot_mapping=[52, 53, 54, 55, 8, 20, 21, 22, 88, 89, 90, 91, 64, 65, 66]),
         flashinfer=dict(qo_indptr=[0, 5, 8, 15], paged_kv_indptr=[0, 2, 3, 5],
                         paged_kv_indices=[13, 2, 5, 22, 16], paged_kv_last_page_len=[1, 3, 3])),
    dict(name="decode", new=[1, 1, 1],
         vllm=dict(seq_lens=[6, 4, 8], query_start_loc=[0, 1, 2, 3],
                   block_table=[[13, 2, 0, 0], [5, 0, 0, 0], [22, 16, 0, 0]]),
         flashinfer=dict(qo_indptr=[0, 1, 2, 3], paged_kv_indptr=[0, 2, 3, 5],
                         paged_kv_indices=[13, 2, 5, 22, 16], paged_kv_last_page_len=[2, 4, 4])),
    dict(name="chunked prefill", new=[4, 4, 1],
         vllm=dict(seq_lens=[10, 8, 9], query_start_loc=[0, 4, 8, 9],
                   block_table=[[13, 2, 27, 0], [5, 30, 0, 0], [22, 16, 9, 0]]),
         flashinfer=dict(qo_indptr=[0, 4, 8, 9], paged_kv_indptr=[0, 3, 5, 8],
                         paged_kv_indices=[13, 2, 27, 5, 30, 22, 16, 9],
                         paged_kv_last_page_len=[2, 4, 1])),
]


def self_attention(backend, rng):
    # Every token each sequence will have: keys, values and queries by position.
    max_len = MAX_BLOCKS * BLOCK_SIZE
    K = [tokens(rng, max_len, NUM_KV_HEADS) for _ in range(3)]
    V = [tokens(rng, max_len, NUM_KV_HEADS) for _ in range(3)]
    Q = [tokens(rng, max_len, NUM_HEADS) for _ in range(3)]
    cached = [0, 0, 0]  # the engine's own count of each sequence's cached tokens
    with pa.KVCache(backend, num_layers=1, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                    num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                    dtype=pa.Dtype.FLOAT32) as cache:
        batch = None
        for step in SELF_STEPS:
            args = from_vllm(**step["vllm"])
            if not same_batch(args, from_flashinfer(**step["flashinfer"], page_size=BLOCK_SIZE)):
                raise SystemExit(f"FAILED: {step['name']}: vLLM and FlashInfer conversions differ")
            if batch is None:
                # The first step plans the batch. Its capacities default to what the tables
                # address (MAX_BLOCKS blocks, 16 tokens per sequence), so the steps below
                # update it in place without hand-set capacities.
                batch = pa.Batch(backend, cache, **args)
                if not np.array_equal(batch.slot_mapping, args["slot_mapping"]):
                    raise SystemExit("FAILED: the library's slots differ from vLLM's")
            else:
                batch.update(**args)
            pos, q, k, v = step_rows(Q, K, V, cached, step["new"])
            # write_kv (the default) stores k/v at their slots first, like vLLM's
            # reshape_and_cache. An engine that already wrote them (FlashInfer's
            # append_paged_kv_cache) passes write_kv=False.
            out = pa.forward(backend, batch, cache, 0, q, k, v)
            ref = causal_ref(Q, K, V, pos)
            check(f"{step['name']:16s} context_lens {args['context_lens'].tolist()} query_lens "
                  f"{args['query_lens'].tolist()}", out, ref)
            cached = [c + n for c, n in zip(cached, step["new"])]
        batch.close()


# ---- cross attention (encoder-decoder) ---------------------------------------------------

# Three decoder sequences over encoder outputs of 6, 3 and 5 tokens. The decoder's own keys
# live in a self-attention cache, the encoder's in a cross cache (it may be the same cache).
ENCODER_LENS = [6, 3, 5]
CROSS_VLLM = dict(encoder_seq_lens=ENCODER_LENS, cross_block_tables=[[7, 3], [12, 0], [1, 14]])
CROSS_FLASHINFER = dict(paged_kv_indptr=[0, 2, 3, 5], paged_kv_indices=[7, 3, 12, 1, 14],
                        paged_kv_last_page_len=[2, 3, 1], width=2)
CROSS_STEPS = [
    dict(name="first step", new=[2, 1, 3],
         vllm=dict(seq_lens=[2, 1, 3], query_start_loc=[0, 2, 3, 6],
                   block_table=[[3, 0], [9, 0], [6, 0]]),
         flashinfer=dict(qo_indptr=[0, 2, 3, 6], paged_kv_indptr=[0, 1, 2, 3],
                         paged_kv_indices=[3, 9, 6], paged_kv_last_page_len=[2, 1, 3], width=2)),
    dict(name="decode", new=[1, 1, 1],
         vllm=dict(seq_lens=[3, 2, 4], query_start_loc=[0, 1, 2, 3],
                   block_table=[[3, 0], [9, 0], [6, 0]]),
         flashinfer=dict(qo_indptr=[0, 1, 2, 3], paged_kv_indptr=[0, 1, 2, 3],
                         paged_kv_indices=[3, 9, 6], paged_kv_last_page_len=[3, 2, 4], width=2)),
]


def cross_attention(backend, rng):
    max_len = 2 * BLOCK_SIZE
    K = [tokens(rng, max_len, NUM_KV_HEADS) for _ in range(3)]  # the decoder's own tokens
    V = [tokens(rng, max_len, NUM_KV_HEADS) for _ in range(3)]
    Q = [tokens(rng, max_len, NUM_HEADS) for _ in range(3)]
    EK = [tokens(rng, n, NUM_KV_HEADS) for n in ENCODER_LENS]  # the encoder's output
    EV = [tokens(rng, n, NUM_KV_HEADS) for n in ENCODER_LENS]
    geometry = dict(num_layers=1, num_blocks=16, block_size=BLOCK_SIZE,
                    num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=pa.Dtype.FLOAT32)
    cached = [0, 0, 0]
    with pa.KVCache(backend, **geometry) as cache, pa.KVCache(backend, **geometry) as xcache:
        batch = None
        for step in CROSS_STEPS:
            args = {**from_vllm(**step["vllm"]), **cross_from_vllm(**CROSS_VLLM)}
            fi = {**from_flashinfer(**step["flashinfer"], page_size=BLOCK_SIZE),
                  **cross_from_flashinfer(**CROSS_FLASHINFER, page_size=BLOCK_SIZE)}
            if not same_batch(args, fi):
                raise SystemExit(f"FAILED: cross {step['name']}: the conversions differ")
            if batch is None:
                batch = pa.Batch(backend, cache, cross_cache=xcache, **args)
            else:
                batch.update(**args)  # passing encoder_lens again is optional in Python
            pos, q, k, v = step_rows(Q, K, V, cached, step["new"])
            # The decoder layer's self attention: causal, over the self-attention cache.
            out = pa.forward(backend, batch, cache, 0, q, k, v)
            ref = causal_ref(Q, K, V, pos)
            check(f"cross {step['name']:10s} self attention ", out, ref)
            # Its cross attention (one q for both here, for brevity). At a sequence's first
            # step (context_len 0) the forward stores the encoder's k/v, whose rows are the
            # encoder tokens of those sequences in sequence order; later steps only read them.
            if step is CROSS_STEPS[0]:
                out = pa.forward(backend, batch, xcache, 0, q, np.concatenate(EK),
                                 np.concatenate(EV), attention_type=pa.AttentionType.CROSS)
            else:
                out = pa.forward(backend, batch, xcache, 0, q, write_kv=False,
                                 attention_type=pa.AttentionType.CROSS)
            # Not causal: every decoder token sees all of its sequence's encoder tokens.
            ref = np.stack([attend(Q[s][t], EK[s], EV[s]) for s, p in enumerate(pos) for t in p])
            check(f"cross {step['name']:10s} cross attention", out, ref)
            cached = [c + n for c, n in zip(cached, step["new"])]
        batch.close()


def main() -> int:
    print(f"pagedattn {pa.version_string()}, backend cpu")
    rng = np.random.default_rng(2024)
    with pa.Backend("cpu") as backend:
        self_attention(backend, rng)
        cross_attention(backend, rng)
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pa.PagedAttnError as e:
        print(f"FAILED: pagedattn error: {e.code.c_name}: {e.message}", file=sys.stderr)
        sys.exit(1)
