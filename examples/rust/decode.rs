//! One decode step over a paged KV cache, from Rust: the same step as examples/c/decode.c.
//!
//! Three sequences already have 5, 17 and 40 tokens in the cache (non-contiguous block tables);
//! this step adds one token to each and runs the attention layer, then checks the output against
//! a float64 reference. Run from bindings/rust: `cargo run --example decode [backend]`.

use pagedattn::{AttentionOptions, Backend, Batch, BatchDesc, CacheDesc, DType, DeviceType, ForwardArgs,
                KvCache, Layout, Tensor, TensorMut};

const NUM_SEQS: usize = 3;
const NUM_HEADS: usize = 8;
const NUM_KV_HEADS: usize = 2; // grouped-query attention: 4 query heads share one KV head
const HEAD_SIZE: usize = 64;
const BLOCK_SIZE: usize = 16;
const NUM_BLOCKS: usize = 16;
const MAX_BLOCKS_PER_SEQ: usize = 4;
const KV_ROW: usize = NUM_KV_HEADS * HEAD_SIZE;
const Q_ROW: usize = NUM_HEADS * HEAD_SIZE;

/// The C example's xorshift generator, so both print the same numbers.
struct Rng(u32);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        (self.0 >> 8) as f32 / 16777216.0 * 2.0 - 1.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend_name = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    let context_lens = [5i32, 17, 40];
    let query_lens = [1i32; NUM_SEQS];
    // Block ids of each sequence, row-major; unused entries are never read.
    let block_tables: [i32; NUM_SEQS * MAX_BLOCKS_PER_SEQ] = [7, 0, 0, 0, 2, 11, 0, 0, 9, 4, 13, 0];

    let version = pagedattn::version();
    if version.major != pagedattn::HEADER_VERSION.major {
        return Err(format!("library {version}, headers {}", pagedattn::HEADER_VERSION).into());
    }
    println!("pagedattn {}, backend {backend_name}", pagedattn::version_string());

    // Every token of every sequence (context plus the new one), as the model would produce them.
    let mut rng = Rng(12345);
    let mut keys = vec![vec![[0f32; KV_ROW]; 64]; NUM_SEQS];
    let mut values = keys.clone();
    let mut query = vec![0f32; NUM_SEQS * Q_ROW];
    for s in 0..NUM_SEQS {
        for t in 0..=usize::try_from(context_lens[s])? {
            for e in 0..KV_ROW {
                keys[s][t][e] = rng.uniform();
                values[s][t][e] = rng.uniform();
            }
        }
        for e in 0..Q_ROW {
            query[s * Q_ROW + e] = rng.uniform();
        }
    }

    let backend = Backend::new(&backend_name)?;
    let caps = backend.capabilities()?;
    if caps.device.device_type != DeviceType::Cpu {
        return Err(format!("backend {} computes on {:?}; this example uses host memory", caps.name, caps.device).into());
    }

    // The cache: one layer, float32, NHD layout.
    let desc = CacheDesc {
        num_layers: 1,
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK_SIZE,
        num_kv_heads: NUM_KV_HEADS,
        head_size: HEAD_SIZE,
        dtype: DType::F32,
        layout: Layout::Nhd,
        flags: 0,
    };
    let cache = KvCache::new(&backend, &desc)?;

    // Earlier steps stored the context: write it with an explicit slot mapping.
    let (mut ctx_k, mut ctx_v, mut ctx_slots) = (Vec::new(), Vec::new(), Vec::new());
    for s in 0..NUM_SEQS {
        for p in 0..usize::try_from(context_lens[s])? {
            ctx_k.extend_from_slice(&keys[s][p]);
            ctx_v.extend_from_slice(&values[s][p]);
            let block = usize::try_from(block_tables[s * MAX_BLOCKS_PER_SEQ + p / BLOCK_SIZE])?;
            ctx_slots.push(i64::try_from(block * BLOCK_SIZE + p % BLOCK_SIZE)?);
        }
    }
    let ctx_shape = [ctx_slots.len(), NUM_KV_HEADS, HEAD_SIZE];
    cache.write(
        0,
        &Tensor::from_slice(&ctx_k, &ctx_shape)?,
        &Tensor::from_slice(&ctx_v, &ctx_shape)?,
        &Tensor::from_i64(&ctx_slots),
        1.0,
        1.0,
    )?;

    // This step: one new token per sequence. Planning validates the tables once.
    let batch = Batch::new(&backend, Some(&cache), None, &BatchDesc {
        query_lens: &query_lens,
        context_lens: &context_lens,
        block_tables: Some(&block_tables),
        block_table_stride: MAX_BLOCKS_PER_SEQ,
        ..BatchDesc::default()
    })?;

    // The new tokens' k/v: row s is sequence s's token at position context_lens[s].
    let positions: Vec<usize> = context_lens.iter().map(|&c| usize::try_from(c)).collect::<Result<_, _>>()?;
    let new_k: Vec<f32> = (0..NUM_SEQS).flat_map(|s| keys[s][positions[s]]).collect();
    let new_v: Vec<f32> = (0..NUM_SEQS).flat_map(|s| values[s][positions[s]]).collect();
    let mut output = vec![0f32; NUM_SEQS * Q_ROW];
    let q_shape = [NUM_SEQS, NUM_HEADS, HEAD_SIZE];
    let kv_shape = [NUM_SEQS, NUM_KV_HEADS, HEAD_SIZE];
    // write_kv (the default): store the new k/v in the cache, then attend over everything.
    let opts = AttentionOptions::new(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE);
    let q = Tensor::from_slice(&query, &q_shape)?;
    let (k, v) = (Tensor::from_slice(&new_k, &kv_shape)?, Tensor::from_slice(&new_v, &kv_shape)?);
    let mut out = TensorMut::from_slice(&mut output, &q_shape)?;
    backend.forward_with(ForwardArgs::new(&batch, &opts, &q, &mut out).cache(&cache).layer(0).kv(&k, &v))?;

    for s in 0..NUM_SEQS {
        let o = &output[s * Q_ROW..];
        println!("seq {s} (context {:2}): out[head 0][0..3] = {:+.5} {:+.5} {:+.5} {:+.5}",
                 context_lens[s], o[0], o[1], o[2], o[3]);
    }

    // float64 reference: softmax(q.k / sqrt(D)) v over positions 0..=context_len.
    let (mut max_err, mut max_ref) = (0f64, 0f64);
    let scale = 1.0 / (HEAD_SIZE as f64).sqrt();
    for s in 0..NUM_SEQS {
        let n = positions[s] + 1;
        for h in 0..NUM_HEADS {
            let kvh = h / (NUM_HEADS / NUM_KV_HEADS);
            let q = &query[s * Q_ROW + h * HEAD_SIZE..][..HEAD_SIZE];
            let scores: Vec<f64> = (0..n)
                .map(|t| {
                    let k = &keys[s][t][kvh * HEAD_SIZE..][..HEAD_SIZE];
                    q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..HEAD_SIZE {
                let r: f64 = (0..n).map(|t| w[t] / sum * values[s][t][kvh * HEAD_SIZE + d] as f64).sum();
                let err = (r - output[s * Q_ROW + h * HEAD_SIZE + d] as f64).abs();
                if err.is_nan() || err > max_err {
                    max_err = err; // NaN propagates as a failure
                }
                max_ref = max_ref.max(r.abs());
            }
        }
    }
    let rel = max_err / max_ref;
    println!("max |out - ref| / max |ref| = {rel:.3e} (float32 tolerance 1e-5)");
    if rel.is_nan() || rel > 1e-5 {
        return Err("output differs from the float64 reference".into());
    }
    println!("ok");
    Ok(())
}
