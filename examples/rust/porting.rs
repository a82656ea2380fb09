//! From vLLM's or FlashInfer's attention metadata to a pagedattn batch, in Rust.
//!
//! An engine that fills vLLM's attention metadata or calls FlashInfer's `plan` already holds
//! every number a pagedattn batch needs (docs/porting.md). Here each step's metadata is written
//! the way each of them holds it; `from_vllm` and `from_flashinfer` turn it into the arrays of a
//! `BatchDesc`, the two conversions are checked to agree, and the forward's output is checked
//! against a float64 reference:
//!
//! 1. prefill: three prompts, nothing cached (`Batch::new`);
//! 2. decode: one token per sequence (the same batch, `update` with its default capacities);
//! 3. chunked prefill: new chunks after cached tokens, next to a decode (a prefix-cache hit is
//!    described the same way);
//! 4. cross attention (encoder-decoder): decoder queries over the encoder's keys, held in a
//!    cross cache through a second set of block tables.
//!
//! Run from bindings/rust: `cargo run --example porting`.

use pagedattn::{AttentionOptions, AttentionType, Backend, Batch, BatchDesc, CacheDesc, DType, ForwardArgs,
                KvCache, Tensor, TensorMut};

const NUM_HEADS: usize = 2;
const NUM_KV_HEADS: usize = 1; // GQA: both query heads share one KV head
const HEAD_SIZE: usize = 16;
const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 32;
const MAX_BLOCKS: usize = 4; // the engine's table width: sequences of up to 16 tokens
const Q_ROW: usize = NUM_HEADS * HEAD_SIZE;
const KV_ROW: usize = NUM_KV_HEADS * HEAD_SIZE;
const TOLERANCE: f64 = 1e-4;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

// ---- the conversions --------------------------------------------------------------------

/// What a pagedattn batch takes, owned; `desc` lends it as the binding's `BatchDesc`.
#[derive(Clone, Debug, Default)]
struct Converted {
    query_lens: Vec<i32>,
    context_lens: Vec<i32>,
    block_tables: Vec<i32>, // row-major [num_seqs][stride]
    stride: usize,
    slot_mapping: Option<Vec<i64>>,
    encoder_lens: Option<Vec<i32>>,
    cross_block_tables: Option<Vec<i32>>,
    cross_stride: usize,
}

impl Converted {
    fn desc(&self) -> BatchDesc<'_> {
        BatchDesc {
            query_lens: &self.query_lens,
            context_lens: &self.context_lens,
            block_tables: Some(&self.block_tables),
            block_table_stride: self.stride,
            slot_mapping: self.slot_mapping.as_deref(),
            encoder_lens: self.encoder_lens.as_deref(),
            cross_block_tables: self.cross_block_tables.as_deref(),
            cross_block_table_stride: self.cross_stride,
            // Capacities stay 0: what this step's sizes and tables address.
            ..BatchDesc::default()
        }
    }

    /// Whether two conversions describe the same batch (the optional slot mapping aside).
    fn same_batch(&self, o: &Converted) -> bool {
        (&self.query_lens, &self.context_lens, &self.block_tables, self.stride)
            == (&o.query_lens, &o.context_lens, &o.block_tables, o.stride)
            && (&self.encoder_lens, &self.cross_block_tables, self.cross_stride)
                == (&o.encoder_lens, &o.cross_block_tables, o.cross_stride)
    }

    /// Adds cross attention: encoder tokens per sequence and their block tables.
    fn with_cross(mut self, (encoder_lens, tables, stride): (Vec<i32>, Vec<i32>, usize)) -> Self {
        self.encoder_lens = Some(encoder_lens);
        self.cross_block_tables = Some(tables);
        self.cross_stride = stride;
        self
    }
}

/// One step as vLLM's `FlashAttentionMetadata` holds it (block_table rows padded to width W).
struct Vllm<const W: usize> {
    seq_lens: &'static [i32],
    query_start_loc: &'static [i32],
    block_table: &'static [[i32; W]],
    slot_mapping: Option<&'static [i64]>,
}

fn from_vllm<const W: usize>(m: &Vllm<W>) -> Converted {
    // num_seqs + 1 offsets -> one count per sequence.
    let query_lens: Vec<i32> = m.query_start_loc.windows(2).map(|w| w[1] - w[0]).collect();
    // seq_lens includes this step's tokens; pagedattn wants the tokens cached BEFORE the step.
    // The classic mistake, `context_lens = seq_lens`, raises no error (every value is in range)
    // but shifts each query query_len positions late, onto keys that do not exist yet.
    let context_lens = m.seq_lens.iter().zip(&query_lens).map(|(s, q)| s - q).collect();
    Converted {
        query_lens,
        context_lens,
        block_tables: m.block_table.concat(), // padding is not read
        stride: W,
        // Optional: pagedattn computes the same slots from the tables. Pass vLLM's only where it
        // differs, e.g. -1 for padding tokens.
        slot_mapping: m.slot_mapping.map(<[i64]>::to_vec),
        ..Converted::default()
    }
}

/// vLLM's encoder-decoder fields -> the cross part of a batch.
fn cross_from_vllm<const W: usize>(encoder_seq_lens: &[i32], cross_block_tables: &[[i32; W]])
                                   -> (Vec<i32>, Vec<i32>, usize) {
    (encoder_seq_lens.to_vec(), cross_block_tables.concat(), W)
}

/// FlashInfer's CSR page list (`paged_kv_indptr`, `paged_kv_indices`, `paged_kv_last_page_len`).
struct PagedKv {
    indptr: &'static [i32],
    indices: &'static [i32],
    last_page_len: &'static [i32],
}

/// Tokens per sequence and block tables padded to `width`, from a page list.
fn kv_lens_and_tables(kv: &PagedKv, page_size: i32, width: usize) -> (Vec<i32>, Vec<i32>) {
    let n = kv.indptr.len() - 1;
    let (mut lens, mut tables) = (Vec::with_capacity(n), vec![0; n * width]);
    for i in 0..n {
        let pages = &kv.indices[kv.indptr[i] as usize..kv.indptr[i + 1] as usize];
        // Full pages, then the last one's tokens; a sequence without pages holds no token.
        lens.push(if pages.is_empty() { 0 } else { (pages.len() as i32 - 1) * page_size + kv.last_page_len[i] });
        tables[i * width..][..pages.len()].copy_from_slice(pages);
    }
    (lens, tables)
}

/// FlashInfer `plan` arguments -> a batch.
fn from_flashinfer(qo_indptr: &[i32], kv: &PagedKv, page_size: i32, width: usize) -> Converted {
    let query_lens: Vec<i32> = qo_indptr.windows(2).map(|w| w[1] - w[0]).collect();
    let (kv_lens, block_tables) = kv_lens_and_tables(kv, page_size, width);
    // FlashInfer's pages already hold this step's tokens (append_paged_kv_cache ran first).
    let context_lens = kv_lens.iter().zip(&query_lens).map(|(k, q)| k - q).collect();
    Converted { query_lens, context_lens, block_tables, stride: width, ..Converted::default() }
}

/// The pages of a cross (non-causal) plan over the encoder -> the cross part of a batch. Their
/// token count is the encoder length itself: no decoder token to subtract.
fn cross_from_flashinfer(kv: &PagedKv, page_size: i32, width: usize) -> (Vec<i32>, Vec<i32>, usize) {
    let (encoder_lens, tables) = kv_lens_and_tables(kv, page_size, width);
    (encoder_lens, tables, width)
}

// ---- the model and the reference --------------------------------------------------------

/// xorshift32: the model's projections, reproducible without a crate.
struct Rng(u32);

impl Rng {
    /// `n` values in [-1, 1).
    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 17;
                self.0 ^= self.0 << 5;
                (self.0 >> 8) as f32 / 16777216.0 * 2.0 - 1.0
            })
            .collect()
    }
}

/// Every token of three sequences by position: keys, values and queries, row-major.
struct Tokens {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    q: Vec<Vec<f32>>,
}

impl Tokens {
    fn new(rng: &mut Rng, len: usize) -> Self {
        let mut side = |row| (0..3).map(|_| rng.values(len * row)).collect::<Vec<_>>();
        Tokens { k: side(KV_ROW), v: side(KV_ROW), q: side(Q_ROW) }
    }
}

/// Rows `cached[s] .. cached[s] + new[s]` of each sequence, one sequence after another (the
/// order of query_start_loc).
fn gather(seqs: &[Vec<f32>], row: usize, cached: &[usize], new: &[usize]) -> Vec<f32> {
    seqs.iter().zip(cached.iter().zip(new)).flat_map(|(x, (&c, &n))| &x[c * row..(c + n) * row]).copied().collect()
}

/// float64 softmax(q k^T / sqrt(D)) v of one token over `keys`/`values` (`[n][Hkv][D]`).
fn attend(q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f64> {
    let n = keys.len() / KV_ROW;
    let mut out = vec![0f64; Q_ROW];
    for h in 0..NUM_HEADS {
        let kvh = h / (NUM_HEADS / NUM_KV_HEADS);
        let qh = &q[h * HEAD_SIZE..][..HEAD_SIZE];
        let scores: Vec<f64> = (0..n)
            .map(|t| {
                let k = &keys[t * KV_ROW + kvh * HEAD_SIZE..][..HEAD_SIZE];
                qh.iter().zip(k).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() / (HEAD_SIZE as f64).sqrt()
            })
            .collect();
        let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
        let sum: f64 = w.iter().sum();
        for (t, wt) in w.iter().enumerate() {
            let v = &values[t * KV_ROW + kvh * HEAD_SIZE..][..HEAD_SIZE];
            for (o, &x) in out[h * HEAD_SIZE..][..HEAD_SIZE].iter_mut().zip(v) {
                *o += wt / sum * f64::from(x);
            }
        }
    }
    out
}

/// The reference of every row of a step: the token at position t of sequence s sees `see(s, t)`
/// keys of `keys[s]` (t + 1 for causal self attention, all encoder tokens for cross).
fn reference(q: &Tokens, keys: &[Vec<f32>], values: &[Vec<f32>], cached: &[usize], new: &[usize],
             see: impl Fn(usize, usize) -> usize) -> Vec<f64> {
    let mut out = Vec::new();
    for (s, (&c, &n)) in cached.iter().zip(new).enumerate() {
        for t in c..c + n {
            let m = see(s, t) * KV_ROW;
            out.extend(attend(&q.q[s][t * Q_ROW..][..Q_ROW], &keys[s][..m], &values[s][..m]));
        }
    }
    out
}

fn check(name: &str, out: &[f32], expected: &[f64]) -> Res<()> {
    let err = out.iter().zip(expected).map(|(&o, &r)| (f64::from(o) - r).abs()).fold(0f64, f64::max);
    println!("{name}: max |out - ref| = {err:.2e}");
    if err.is_nan() || err > TOLERANCE || out.len() != expected.len() {
        return Err(format!("{name}: output differs from the float64 reference ({err:.3e})").into());
    }
    Ok(())
}

/// One forward over `rows` new tokens; `k`/`v` None when the cache already holds them.
fn forward(backend: &Backend, batch: &Batch, cache: &KvCache<'_>, opts: &AttentionOptions<'_>,
           q: &[f32], kv: Option<(&[f32], &[f32])>) -> Res<Vec<f32>> {
    let rows = q.len() / Q_ROW;
    let mut out = vec![0f32; q.len()];
    let kv_shape = |x: &[f32]| [x.len() / KV_ROW, NUM_KV_HEADS, HEAD_SIZE];
    let k = kv.map(|(k, _)| Tensor::from_slice(k, &kv_shape(k))).transpose()?;
    let v = kv.map(|(_, v)| Tensor::from_slice(v, &kv_shape(v))).transpose()?;
    let q = Tensor::from_slice(q, &[rows, NUM_HEADS, HEAD_SIZE])?;
    let mut out_t = TensorMut::from_slice(&mut out, &[rows, NUM_HEADS, HEAD_SIZE])?;
    backend.forward_with(ForwardArgs { k: k.as_ref(), v: v.as_ref(),
                                       ..ForwardArgs::new(batch, opts, &q, &mut out_t).cache(cache) })?;
    Ok(out)
}

// ---- decoder steps: prefill, decode, chunked prefill ------------------------------------

/// One step as vLLM and FlashInfer hold it; `new` is the engine's own count of each sequence's
/// new tokens.
struct Step<const W: usize> {
    name: &'static str,
    new: [usize; 3],
    vllm: Vllm<W>,
    qo_indptr: &'static [i32],
    paged_kv: PagedKv,
}

// Block size 4; blocks allocated as the sequences grow, in no particular order.
const SELF_STEPS: [Step<MAX_BLOCKS>; 3] = [
    Step {
        name: "prefill",
        new: [5, 3, 7],
        vllm: Vllm {
            seq_lens: &[5, 3, 7],
            query_start_loc: &[0, 5, 8, 15],
            block_table: &[[13, 2, 0, 0], [5, 0, 0, 0], [22, 16, 0, 0]],
            slot_mapping: Some(&[52, 53, 54, 55, 8, 20, 21, 22, 88, 89, 90, 91, 64, 65, 66]),
        },
        qo_indptr: &[0, 5, 8, 15],
        paged_kv: PagedKv { indptr: &[0, 2, 3, 5], indices: &[13, 2, 5, 22, 16], last_page_len: &[1, 3, 3] },
    },
    Step {
        name: "decode",
        new: [1, 1, 1],
        vllm: Vllm {
            seq_lens: &[6, 4, 8],
            query_start_loc: &[0, 1, 2, 3],
            block_table: &[[13, 2, 0, 0], [5, 0, 0, 0], [22, 16, 0, 0]],
            slot_mapping: None,
        },
        qo_indptr: &[0, 1, 2, 3],
        paged_kv: PagedKv { indptr: &[0, 2, 3, 5], indices: &[13, 2, 5, 22, 16], last_page_len: &[2, 4, 4] },
    },
    Step {
        name: "chunked prefill",
        new: [4, 4, 1],
        vllm: Vllm {
            seq_lens: &[10, 8, 9],
            query_start_loc: &[0, 4, 8, 9],
            block_table: &[[13, 2, 27, 0], [5, 30, 0, 0], [22, 16, 9, 0]],
            slot_mapping: None,
        },
        qo_indptr: &[0, 4, 8, 9],
        paged_kv: PagedKv {
            indptr: &[0, 3, 5, 8],
            indices: &[13, 2, 27, 5, 30, 22, 16, 9],
            last_page_len: &[2, 4, 1],
        },
    },
];

fn self_attention(backend: &Backend, rng: &mut Rng) -> Res<()> {
    let model = Tokens::new(rng, MAX_BLOCKS * BLOCK_SIZE);
    let cache = KvCache::new(backend, &CacheDesc {
        num_layers: 1, num_blocks: NUM_BLOCKS, block_size: BLOCK_SIZE, num_kv_heads: NUM_KV_HEADS,
        head_size: HEAD_SIZE, dtype: DType::F32, ..CacheDesc::default()
    })?;
    // write_kv (the default) stores k/v at their slots first, like vLLM's reshape_and_cache. An
    // engine that already wrote them (FlashInfer's append_paged_kv_cache) sets write_kv false.
    let opts = AttentionOptions::new(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE);
    let mut cached = [0usize; 3]; // the engine's own count of each sequence's cached tokens
    let mut batch: Option<Batch> = None;
    for step in &SELF_STEPS {
        let args = from_vllm(&step.vllm);
        if !args.same_batch(&from_flashinfer(step.qo_indptr, &step.paged_kv, BLOCK_SIZE as i32, MAX_BLOCKS)) {
            return Err(format!("{}: the vLLM and FlashInfer conversions differ", step.name).into());
        }
        if let Some(b) = batch.as_mut() {
            // Later steps update the planned batch in place: its capacities default to what the
            // first step's tables address (MAX_BLOCKS blocks, 16 tokens per sequence).
            b.update(&args.desc())?;
        } else {
            let b = Batch::new(backend, Some(&cache), None, &args.desc())?;
            if Some(b.slot_mapping()?) != args.slot_mapping.as_deref() {
                return Err("the library's slots differ from vLLM's".into());
            }
            batch = Some(b);
        }
        let batch = batch.as_ref().ok_or("no batch")?;
        let q = gather(&model.q, Q_ROW, &cached, &step.new);
        let k = gather(&model.k, KV_ROW, &cached, &step.new);
        let v = gather(&model.v, KV_ROW, &cached, &step.new);
        let out = forward(backend, batch, &cache, &opts, &q, Some((&k, &v)))?;
        // Causal: the token at position t sees its sequence's positions 0..=t.
        let expected = reference(&model, &model.k, &model.v, &cached, &step.new, |_, t| t + 1);
        check(&format!("{:16} context_lens {:?} query_lens {:?}", step.name, args.context_lens, args.query_lens),
              &out, &expected)?;
        for (c, n) in cached.iter_mut().zip(step.new) {
            *c += n;
        }
    }
    Ok(())
}

// ---- cross attention (encoder-decoder) --------------------------------------------------

// Three decoder sequences over encoder outputs of 6, 3 and 5 tokens. The decoder's own keys
// live in a self-attention cache, the encoder's in a cross cache (it may be the same cache).
const ENCODER_LENS: [i32; 3] = [6, 3, 5];
const CROSS_TABLES: [[i32; 2]; 3] = [[7, 3], [12, 0], [1, 14]];
const CROSS_PAGED_KV: PagedKv = PagedKv { indptr: &[0, 2, 3, 5], indices: &[7, 3, 12, 1, 14], last_page_len: &[2, 3, 1] };
const CROSS_STEPS: [Step<2>; 2] = [
    Step {
        name: "first step",
        new: [2, 1, 3],
        vllm: Vllm {
            seq_lens: &[2, 1, 3],
            query_start_loc: &[0, 2, 3, 6],
            block_table: &[[3, 0], [9, 0], [6, 0]],
            slot_mapping: None,
        },
        qo_indptr: &[0, 2, 3, 6],
        paged_kv: PagedKv { indptr: &[0, 1, 2, 3], indices: &[3, 9, 6], last_page_len: &[2, 1, 3] },
    },
    Step {
        name: "decode",
        new: [1, 1, 1],
        vllm: Vllm {
            seq_lens: &[3, 2, 4],
            query_start_loc: &[0, 1, 2, 3],
            block_table: &[[3, 0], [9, 0], [6, 0]],
            slot_mapping: None,
        },
        qo_indptr: &[0, 1, 2, 3],
        paged_kv: PagedKv { indptr: &[0, 1, 2, 3], indices: &[3, 9, 6], last_page_len: &[3, 2, 4] },
    },
];

fn cross_attention(backend: &Backend, rng: &mut Rng) -> Res<()> {
    let model = Tokens::new(rng, 2 * BLOCK_SIZE); // the decoder's own tokens
    let enc_k: Vec<Vec<f32>> = ENCODER_LENS.iter().map(|&n| rng.values(n as usize * KV_ROW)).collect();
    let enc_v: Vec<Vec<f32>> = ENCODER_LENS.iter().map(|&n| rng.values(n as usize * KV_ROW)).collect();
    let desc = CacheDesc {
        num_layers: 1, num_blocks: 16, block_size: BLOCK_SIZE, num_kv_heads: NUM_KV_HEADS,
        head_size: HEAD_SIZE, dtype: DType::F32, ..CacheDesc::default()
    };
    let (cache, xcache) = (KvCache::new(backend, &desc)?, KvCache::new(backend, &desc)?);
    let self_opts = AttentionOptions::new(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE);
    let cross_opts = AttentionOptions { attention_type: AttentionType::Cross, ..self_opts.clone() };
    let mut cached = [0usize; 3];
    let mut batch: Option<Batch> = None;
    for (i, step) in CROSS_STEPS.iter().enumerate() {
        // The update of a step repeats the encoder fields, as vLLM's metadata does.
        let args = from_vllm(&step.vllm).with_cross(cross_from_vllm(&ENCODER_LENS, &CROSS_TABLES));
        let fi = from_flashinfer(step.qo_indptr, &step.paged_kv, BLOCK_SIZE as i32, 2)
            .with_cross(cross_from_flashinfer(&CROSS_PAGED_KV, BLOCK_SIZE as i32, 2));
        if !args.same_batch(&fi) {
            return Err(format!("cross {}: the vLLM and FlashInfer conversions differ", step.name).into());
        }
        if let Some(b) = batch.as_mut() {
            b.update(&args.desc())?;
        } else {
            batch = Some(Batch::new(backend, Some(&cache), Some(&xcache), &args.desc())?);
        }
        let batch = batch.as_ref().ok_or("no batch")?;
        let q = gather(&model.q, Q_ROW, &cached, &step.new);
        let k = gather(&model.k, KV_ROW, &cached, &step.new);
        let v = gather(&model.v, KV_ROW, &cached, &step.new);
        // The decoder layer's self attention: causal, over the self-attention cache.
        let out = forward(backend, batch, &cache, &self_opts, &q, Some((&k, &v)))?;
        let expected = reference(&model, &model.k, &model.v, &cached, &step.new, |_, t| t + 1);
        check(&format!("cross {:10} self attention ", step.name), &out, &expected)?;
        // Its cross attention (one q for both here, for brevity). At a sequence's first step
        // (context_len 0) the forward stores the encoder's k/v, whose rows are the encoder tokens
        // of those sequences in sequence order; later steps only read them.
        let out = if i == 0 {
            let (ek, ev) = (enc_k.concat(), enc_v.concat());
            forward(backend, batch, &xcache, &cross_opts, &q, Some((&ek, &ev)))?
        } else {
            forward(backend, batch, &xcache, &AttentionOptions { write_kv: false, ..cross_opts.clone() }, &q, None)?
        };
        // Not causal: every decoder token sees all of its sequence's encoder tokens.
        let expected = reference(&model, &enc_k, &enc_v, &cached, &step.new, |s, _| ENCODER_LENS[s] as usize);
        check(&format!("cross {:10} cross attention", step.name), &out, &expected)?;
        for (c, n) in cached.iter_mut().zip(step.new) {
            *c += n;
        }
    }
    Ok(())
}

fn main() {
    println!("pagedattn {}, backend cpu", pagedattn::version_string());
    let run = || -> Res<()> {
        let backend = Backend::new("cpu")?;
        let mut rng = Rng(2024);
        self_attention(&backend, &mut rng)?;
        cross_attention(&backend, &mut rng)
    };
    if let Err(e) = run() {
        eprintln!("FAILED: {e}");
        std::process::exit(1);
    }
    println!("ok");
}
