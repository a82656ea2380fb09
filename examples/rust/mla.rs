//! One multi-head latent attention (MLA) decode step from Rust, DeepSeek-V3-like: 16 query heads
//! (one tensor-parallel shard of 128), latent rows of 576 = 512 (kv_lora_rank) + 64 (rotary
//! key), blocks of 64 tokens, bfloat16.
//!
//! Four sequences already have 300, 17, 1000 and 64 tokens in a latent cache (shuffled block
//! tables); this step writes each one's new row with `write_latent` (vLLM's
//! concat_and_cache_mla), runs `forward_mla_with` in the absorbed form (q_nope already multiplied
//! by W_UK, plus q_pe) and checks the output against a float64 reference.
//! Run from bindings/rust: `cargo run --example mla [backend]`.

use half::bf16;
use pagedattn::{AttentionOptions, Backend, Batch, BatchDesc, CacheDesc, DType, DeviceType, Features, KvCache,
                MlaForwardArgs, Tensor, TensorMut};

const NUM_HEADS: usize = 16;
const KV_LORA_RANK: usize = 512;
const ROPE_DIM: usize = 64;
const ROW: usize = KV_LORA_RANK + ROPE_DIM; // 576
const BLOCK_SIZE: usize = 64;
const CONTEXT_LENS: [usize; 4] = [300, 17, 1000, 64];
const TOLERANCE: f64 = 2e-2; // bfloat16

/// xorshift64: values in [-1, 1) and shuffles.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn uniform_bf16(&mut self, n: usize) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32((self.next() >> 40) as f32 / 16777216.0 * 2.0 - 1.0)).collect()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend_name = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    // DeepSeek V3's softmax scale: mscale^2 / sqrt(qk_nope_head_dim + qk_rope_head_dim), with
    // mscale = 0.1 * ln(40) + 1 (YaRN, factor 40).
    let scale = (0.1 * 40f64.ln() + 1.0).powi(2) / 192f64.sqrt();
    let n = CONTEXT_LENS.len();
    println!("pagedattn {}, backend {backend_name}", pagedattn::version_string());

    let backend = Backend::new(&backend_name)?;
    let caps = backend.capabilities()?;
    if caps.device.device_type != DeviceType::Cpu {
        return Err(format!("backend {} computes on {:?}; this example uses host memory", caps.name, caps.device).into());
    }
    if !caps.features.contains(Features::MLA) || !caps.latent_size_list().contains(&ROW) {
        return Err(format!("backend {} has no MLA with rows of {ROW}", caps.name).into());
    }

    // Shuffled block tables, each sized for the sequence with this step's token.
    let mut rng = Rng(0x2024_0517_9E37_79B9);
    let need: Vec<usize> = CONTEXT_LENS.iter().map(|c| (c + 1).div_ceil(BLOCK_SIZE)).collect();
    let stride = *need.iter().max().unwrap_or(&1);
    let num_blocks = need.iter().sum::<usize>() + 8;
    let mut free: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..num_blocks).rev() {
        free.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut tables = vec![0i32; n * stride];
    let mut at = 0;
    for (s, &k) in need.iter().enumerate() {
        tables[s * stride..s * stride + k].copy_from_slice(&free[at..at + k]);
        at += k;
    }
    let slot = |s: usize, p: usize| i64::from(tables[s * stride + p / BLOCK_SIZE]) * BLOCK_SIZE as i64 + (p % BLOCK_SIZE) as i64;

    // Every latent row of every sequence: the context plus the new token.
    let rows: Vec<Vec<bf16>> = CONTEXT_LENS.iter().map(|&c| rng.uniform_bf16((c + 1) * ROW)).collect();

    let cache = KvCache::new(&backend, &CacheDesc {
        num_layers: 1, num_blocks, block_size: BLOCK_SIZE, num_kv_heads: 1, head_size: ROW, dtype: DType::BF16,
        flags: CacheDesc::LATENT, ..CacheDesc::default()
    })?;
    // Earlier steps stored the context: kv_c [T, 512] and k_pe [T, 1, 64], vLLM's shapes.
    let (mut kv_c, mut k_pe, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for (s, &c) in CONTEXT_LENS.iter().enumerate() {
        for p in 0..c {
            kv_c.extend_from_slice(&rows[s][p * ROW..p * ROW + KV_LORA_RANK]);
            k_pe.extend_from_slice(&rows[s][p * ROW + KV_LORA_RANK..(p + 1) * ROW]);
            slots.push(slot(s, p));
        }
    }
    let t = slots.len();
    cache.write_latent(0, &Tensor::from_slice(&kv_c, &[t, KV_LORA_RANK])?,
                       Some(&Tensor::from_slice(&k_pe, &[t, 1, ROPE_DIM])?), &Tensor::from_i64(&slots), 1.0)?;

    // This step: each sequence's new row goes in first (whole rows, no k_pe), then the attention
    // reads it with the context.
    let new: Vec<bf16> = CONTEXT_LENS.iter().enumerate().flat_map(|(s, &c)| rows[s][c * ROW..].iter().copied()).collect();
    let new_slots: Vec<i64> = CONTEXT_LENS.iter().enumerate().map(|(s, &c)| slot(s, c)).collect();
    cache.write_latent(0, &Tensor::from_slice(&new, &[n, ROW])?, None, &Tensor::from_i64(&new_slots), 1.0)?;

    let q = rng.uniform_bf16(n * NUM_HEADS * ROW);
    let (mut q_nope, mut q_pe) = (Vec::new(), Vec::new());
    for head_row in q.chunks(ROW) {
        q_nope.extend_from_slice(&head_row[..KV_LORA_RANK]);
        q_pe.extend_from_slice(&head_row[KV_LORA_RANK..]);
    }
    let query_lens = vec![1i32; n];
    let context_lens: Vec<i32> = CONTEXT_LENS.iter().map(|&c| c as i32).collect();
    let batch = Batch::new(&backend, Some(&cache), None, &BatchDesc {
        query_lens: &query_lens, context_lens: &context_lens, block_tables: Some(&tables), block_table_stride: stride,
        ..BatchDesc::default()
    })?;
    let opts = AttentionOptions { scale: scale as f32, ..AttentionOptions::mla(NUM_HEADS, ROW) };
    let mut out = vec![bf16::ZERO; n * NUM_HEADS * KV_LORA_RANK];
    {
        let (nope_t, pe_t) = (Tensor::from_slice(&q_nope, &[n, NUM_HEADS, KV_LORA_RANK])?,
                              Tensor::from_slice(&q_pe, &[n, NUM_HEADS, ROPE_DIM])?);
        let mut out_t = TensorMut::from_slice(&mut out, &[n, NUM_HEADS, KV_LORA_RANK])?;
        backend.forward_mla_with(MlaForwardArgs::new(&batch, &cache, &opts, &nope_t, &mut out_t).q_pe(&pe_t))?;
    }
    println!("out: {n} tokens x {NUM_HEADS} heads x {KV_LORA_RANK} values (bfloat16)");

    // float64 reference: each key's row is the key (all 576 values) and the value (first 512).
    let scale = f64::from(scale as f32);
    let (mut max_err, mut max_ref) = (0f64, 0f64);
    for (s, &c) in CONTEXT_LENS.iter().enumerate() {
        let keys: Vec<f64> = rows[s].iter().map(|x| f64::from(x.to_f32())).collect();
        for h in 0..NUM_HEADS {
            let qh: Vec<f64> = q[(s * NUM_HEADS + h) * ROW..][..ROW].iter().map(|x| f64::from(x.to_f32())).collect();
            let sc: Vec<f64> = keys.chunks(ROW).take(c + 1).map(|k| k.iter().zip(&qh).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for i in 0..KV_LORA_RANK {
                let r: f64 = w.iter().enumerate().map(|(p, wp)| wp * keys[p * ROW + i]).sum::<f64>() / sum;
                let got = f64::from(out[(s * NUM_HEADS + h) * KV_LORA_RANK + i].to_f32());
                max_err = max_err.max((got - r).abs());
                max_ref = max_ref.max(r.abs());
            }
        }
    }
    let rel = max_err / max_ref;
    println!("max relative error {rel:.3e} (bfloat16 tolerance {TOLERANCE:e})");
    if rel.is_nan() || rel > TOLERANCE {
        return Err("output differs from the float64 reference".into());
    }
    println!("ok");
    Ok(())
}
