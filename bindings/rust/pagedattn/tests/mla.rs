//! Multi-head latent attention (MLA, docs/semantics.md section 8): latent caches, write_latent
//! and forward_mla against a float64 reference, the refusals between plain and latent caches,
//! and the feature bit and capabilities field that announce them.

use pagedattn::{AttentionOptions, Backend, Batch, BatchDesc, CacheDesc, DType, Features, ForwardArgs, KvCache,
                MlaForwardArgs, Status, Stream, Tensor, TensorMut};

// DeepSeek V3's shape: 16 heads (one tensor-parallel shard), rows of 512 + 64.
const H: usize = 16;
const D: usize = 576;
const R: usize = 512;

fn cpu() -> Backend {
    Backend::new("cpu").expect("cpu backend")
}

/// Deterministic xorshift values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn uniform(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
    }

    fn shuffled(&mut self, n: usize) -> Vec<i32> {
        let mut ids: Vec<i32> = (0..n as i32).collect();
        for i in (1..n).rev() {
            ids.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
        ids
    }
}

/// bfloat16 bits of x, rounded to nearest even (finite inputs).
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Elements of one dtype: f32 as is, bfloat16 as raw bits.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dt {
    F32,
    Bf16,
}

impl Dt {
    fn dtype(self) -> DType {
        match self {
            Dt::F32 => DType::F32,
            Dt::Bf16 => DType::BF16,
        }
    }

    fn tolerance(self) -> f64 {
        match self {
            Dt::F32 => 1e-5,
            Dt::Bf16 => 2e-2,
        }
    }

    /// The values this dtype holds of `x`.
    fn round(self, x: &[f32]) -> Vec<f32> {
        match self {
            Dt::F32 => x.to_vec(),
            Dt::Bf16 => x.iter().map(|&v| bf16_value(bf16_bits(v))).collect(),
        }
    }
}

/// Host data of one dtype, viewed as tensors.
enum Data {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Data {
    fn new(dt: Dt, x: &[f32]) -> Data {
        match dt {
            Dt::F32 => Data::F32(x.to_vec()),
            Dt::Bf16 => Data::Bf16(x.iter().map(|&v| bf16_bits(v)).collect()),
        }
    }

    fn zeros(dt: Dt, n: usize) -> Data {
        Data::new(dt, &vec![0.0; n])
    }

    fn tensor(&self, shape: &[usize]) -> Tensor<'_> {
        match self {
            Data::F32(v) => Tensor::new(v, DType::F32, shape).unwrap(),
            Data::Bf16(v) => Tensor::new(v, DType::BF16, shape).unwrap(),
        }
    }

    fn tensor_mut(&mut self, shape: &[usize]) -> TensorMut<'_> {
        match self {
            Data::F32(v) => TensorMut::new(v, DType::F32, shape).unwrap(),
            Data::Bf16(v) => TensorMut::new(v, DType::BF16, shape).unwrap(),
        }
    }

    fn to_f64(&self) -> Vec<f64> {
        match self {
            Data::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::Bf16(v) => v.iter().map(|&x| f64::from(bf16_value(x))).collect(),
        }
    }
}

/// Columns [from, to) of a row-major [rows, D] matrix.
fn columns(x: &[f32], from: usize, to: usize) -> Vec<f32> {
    x.chunks(D).flat_map(|row| row[from..to].iter().copied()).collect()
}

/// Random latent rows of a few sequences in a latent cache with shuffled block tables. The
/// context rows go in through the two-tensor form of write_latent (kv_c, k_pe), the step's new
/// rows through the whole-row form (k_pe None), as an engine writes them before the forward.
struct Step {
    dt: Dt,
    lens: Vec<(usize, usize)>, // (query, context)
    tables: Vec<i32>,
    stride: usize,
    rows: Vec<Vec<f32>>, // per sequence: [context + query][D], the values the cache holds
    q: Vec<f32>,         // [T][H][D], the values the query tensors hold
    cache: KvCache<'static>,
}

impl Step {
    fn new(be: &Backend, dt: Dt, lens: &[(usize, usize)], bs: usize, seed: u64, k_pe_3d: bool) -> Step {
        let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
        let need: Vec<usize> = lens.iter().map(|&(q, c)| (q + c).div_ceil(bs)).collect();
        let stride = need.iter().copied().max().unwrap_or(1).max(1);
        let nb = need.iter().sum::<usize>() + 3;
        let ids = rng.shuffled(nb);
        let mut tables = vec![0i32; lens.len() * stride];
        let mut at = 0;
        for (i, &n) in need.iter().enumerate() {
            tables[i * stride..i * stride + n].copy_from_slice(&ids[at..at + n]);
            at += n;
        }
        let cache = KvCache::new(be, &CacheDesc { num_layers: 2, num_blocks: nb, block_size: bs, num_kv_heads: 1,
                                                  head_size: D, dtype: dt.dtype(), flags: CacheDesc::LATENT,
                                                  ..CacheDesc::default() }).unwrap();
        let slot = |s: usize, p: usize| i64::from(tables[s * stride + p / bs]) * bs as i64 + (p % bs) as i64;
        let mut rows = Vec::new();
        let (mut ctx, mut ctx_slots, mut new, mut new_slots) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (s, &(q, c)) in lens.iter().enumerate() {
            let raw = dt.round(&rng.uniform((c + q) * D));
            ctx.extend_from_slice(&raw[..c * D]);
            new.extend_from_slice(&raw[c * D..]);
            ctx_slots.extend((0..c).map(|p| slot(s, p)));
            new_slots.extend((c..c + q).map(|p| slot(s, p)));
            rows.push(raw);
        }
        let (nc, nn) = (ctx_slots.len(), new_slots.len());
        let kv_c = Data::new(dt, &columns(&ctx, 0, R));
        let k_pe = Data::new(dt, &columns(&ctx, R, D));
        let pe_shape: &[usize] = if k_pe_3d { &[nc, 1, D - R] } else { &[nc, D - R] };
        cache.write_latent(1, &kv_c.tensor(&[nc, R]), Some(&k_pe.tensor(pe_shape)), &Tensor::from_i64(&ctx_slots), 1.0)
            .unwrap();
        let whole = Data::new(dt, &new);
        let slots32: Vec<i32> = new_slots.iter().map(|&s| s as i32).collect();
        cache.write_latent_on(Stream::DEFAULT, 1, &whole.tensor(&[nn, D]), None, &Tensor::from_i32(&slots32), 1.0)
            .unwrap();
        let t: usize = lens.iter().map(|&(q, _)| q).sum();
        let q = dt.round(&rng.uniform(t * H * D));
        Step { dt, lens: lens.to_vec(), tables, stride, rows, q, cache }
    }

    fn tokens(&self) -> usize {
        self.lens.iter().map(|&(q, _)| q).sum()
    }

    fn batch(&self, be: &Backend) -> Batch {
        let ql: Vec<i32> = self.lens.iter().map(|&(q, _)| q as i32).collect();
        let cl: Vec<i32> = self.lens.iter().map(|&(_, c)| c as i32).collect();
        Batch::new(be, Some(&self.cache), None, &BatchDesc { query_lens: &ql, context_lens: &cl,
                   block_tables: Some(&self.tables), block_table_stride: self.stride, ..BatchDesc::default() })
            .unwrap()
    }

    /// The query split as q_nope [T, H, R] and q_pe [T, H, D - R].
    fn q_parts(&self) -> (Data, Data) {
        let rows = self.tokens() * H;
        let (mut nope, mut pe) = (Vec::with_capacity(rows * R), Vec::with_capacity(rows * (D - R)));
        for row in self.q.chunks(D) {
            nope.extend_from_slice(&row[..R]);
            pe.extend_from_slice(&row[R..]);
        }
        (Data::new(self.dt, &nope), Data::new(self.dt, &pe))
    }

    /// float64 reference: each key's row is its key (all D values) and its value (the first R).
    /// Returns (out [T][H][R], lse [T][H]).
    fn reference(&self, scale: f64) -> (Vec<f64>, Vec<f64>) {
        let scale = if scale == 0.0 { 1.0 / (D as f64).sqrt() } else { scale };
        let t = self.tokens();
        let (mut out, mut lse) = (vec![0f64; t * H * R], vec![0f64; t * H]);
        let mut tok = 0;
        for (s, &(ql, cl)) in self.lens.iter().enumerate() {
            let rows = &self.rows[s];
            for j in 0..ql {
                let n = cl + j + 1;
                for h in 0..H {
                    let q = &self.q[(tok * H + h) * D..(tok * H + h + 1) * D];
                    let sc: Vec<f64> = (0..n)
                        .map(|p| (0..D).map(|i| f64::from(q[i]) * f64::from(rows[p * D + i])).sum::<f64>() * scale)
                        .collect();
                    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    let o = &mut out[(tok * H + h) * R..(tok * H + h + 1) * R];
                    for (p, wp) in w.iter().enumerate() {
                        for (i, oi) in o.iter_mut().enumerate() {
                            *oi += wp * f64::from(rows[p * D + i]);
                        }
                    }
                    o.iter_mut().for_each(|x| *x /= sum);
                    lse[tok * H + h] = m + sum.ln();
                }
                tok += 1;
            }
        }
        (out, lse)
    }
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let max_ref = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    let max_diff = got.iter().zip(want).fold(0f64, |m, (g, w)| if g.is_nan() { f64::INFINITY } else { m.max((g - w).abs()) });
    max_diff / max_ref.max(1e-30)
}

/// Runs forward_mla (q split in two) on layer 1; returns (out, lse).
fn run(be: &Backend, step: &Step, opts: &AttentionOptions<'_>) -> (Vec<f64>, Vec<f32>) {
    let t = step.tokens();
    let batch = step.batch(be);
    let (nope, pe) = step.q_parts();
    let (nope_t, pe_t) = (nope.tensor(&[t, H, R]), pe.tensor(&[t, H, D - R]));
    let mut out = Data::zeros(step.dt, t * H * R);
    let mut lse = vec![f32::NAN; t * H];
    {
        let mut out_t = out.tensor_mut(&[t, H, R]);
        let mut lse_t = TensorMut::from_slice(&mut lse, &[t, H]).unwrap();
        be.forward_mla_with(MlaForwardArgs::new(&batch, &step.cache, opts, &nope_t, &mut out_t).q_pe(&pe_t).layer(1)
            .lse(&mut lse_t)).unwrap();
    }
    (out.to_f64(), lse)
}

#[test]
fn feature_bit_and_latent_sizes() {
    let caps = cpu().capabilities().unwrap();
    assert_eq!(Features::MLA.0, 1 << 16);
    assert!(caps.features.contains(Features::MLA));
    let sizes = caps.latent_size_list();
    assert!(sizes.contains(&D), "{sizes:?}");
    assert!(sizes.iter().all(|s| s % 32 == 0 && (32..=1024).contains(s)));
}

#[test]
fn decode_matches_reference() {
    let be = cpu();
    for (dt, bs) in [(Dt::F32, 16), (Dt::Bf16, 64), (Dt::Bf16, 16), (Dt::F32, 64)] {
        let step = Step::new(&be, dt, &[(1, 37), (1, 5), (1, 130), (1, 64)], bs, 60 + bs as u64, bs == 64);
        let (out, lse) = run(&be, &step, &AttentionOptions::mla(H, D));
        let (want, want_lse) = step.reference(0.0);
        let err = rel_err(&out, &want);
        assert!(err <= dt.tolerance(), "{dt:?} block {bs}: relative error {err}");
        for (g, w) in lse.iter().zip(&want_lse) {
            assert!((f64::from(*g) - w).abs() <= 1e-5 + dt.tolerance().max(1e-5) * w.abs(), "lse {g} vs {w}");
        }
    }
}

#[test]
fn prefill_and_chunked_prefill_match_reference() {
    let be = cpu();
    // A fresh prompt, a decode and a chunk of a prompt with context, in one step.
    for dt in [Dt::F32, Dt::Bf16] {
        let step = Step::new(&be, dt, &[(9, 0), (1, 40), (20, 13)], 16, 70, false);
        let opts = AttentionOptions { scale: 0.1352, ..AttentionOptions::mla(H, D) };
        let (out, _) = run(&be, &step, &opts);
        let err = rel_err(&out, &step.reference(0.1352).0);
        assert!(err <= dt.tolerance(), "{dt:?}: relative error {err}");
    }
}

#[test]
fn whole_query_rows_through_the_positional_form() {
    let be = cpu();
    let step = Step::new(&be, Dt::F32, &[(1, 50), (3, 17)], 64, 71, false);
    let batch = step.batch(&be);
    let t = step.tokens();
    let mut out = vec![f32::NAN; t * H * R];
    be.forward_mla(&batch, &step.cache, 1, &AttentionOptions::mla(H, D), &Tensor::from_slice(&step.q, &[t, H, D]).unwrap(),
                   None, &mut TensorMut::from_slice(&mut out, &[t, H, R]).unwrap(), None).unwrap();
    let got: Vec<f64> = out.iter().map(|&x| f64::from(x)).collect();
    let err = rel_err(&got, &step.reference(0.0).0);
    assert!(err <= 1e-5, "relative error {err}");
    // Layer 0 holds no rows: the cache is written per layer.
    be.forward_mla(&batch, &step.cache, 0, &AttentionOptions::mla(H, D), &Tensor::from_slice(&step.q, &[t, H, D]).unwrap(),
                   None, &mut TensorMut::from_slice(&mut out, &[t, H, R]).unwrap(), None).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
}

#[test]
fn latent_cache_geometry_and_wrap() {
    let be = cpu();
    let d = CacheDesc { num_layers: 3, num_blocks: 1, block_size: 16, num_kv_heads: 1, head_size: D, dtype: DType::BF16,
                        flags: CacheDesc::LATENT, ..CacheDesc::default() };
    assert!(d.is_latent());
    assert_eq!(d.bytes_per_block().unwrap(), 3 * 16 * D as u64 * 2); // one row per slot, no V
    assert_eq!(CacheDesc { flags: 0, ..d }.bytes_per_block().unwrap(), 2 * 3 * 16 * D as u64 * 2);
    // A wrapped latent cache without V slices: the caller's memory holds the rows written.
    let wd = CacheDesc { num_layers: 1, num_blocks: 4, dtype: DType::F32, ..d };
    let mut mem = vec![0f32; 4 * 16 * D];
    let rows = Rng(72).uniform(3 * D);
    {
        let cache = KvCache::wrap(&be, &wd, vec![&mut mem[..]], Vec::new(), None).unwrap();
        assert!(cache.desc().unwrap().is_latent());
        let (c, pe) = (columns(&rows, 0, R), columns(&rows, R, D));
        cache.write_latent(0, &Tensor::from_slice(&c, &[3, R]).unwrap(), Some(&Tensor::from_slice(&pe, &[3, D - R]).unwrap()),
                           &Tensor::from_i64(&[2 * 16 + 5, 7, 3 * 16]), 1.0).unwrap();
    }
    for (i, slot) in [2 * 16 + 5, 7, 3 * 16].into_iter().enumerate() {
        assert_eq!(&mem[slot * D..(slot + 1) * D], &rows[i * D..(i + 1) * D]);
    }
    // A plain cache still needs its V slices.
    let mut k = vec![0f32; 4 * 16 * D];
    let err = KvCache::wrap(&be, &CacheDesc { flags: 0, ..wd }, vec![&mut k[..]], Vec::new(), None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn plain_and_latent_caches_refuse_each_others_calls() {
    let be = cpu();
    let step = Step::new(&be, Dt::F32, &[(1, 20)], 16, 73, false);
    let batch = step.batch(&be);
    let q = vec![0f32; H * D];
    let kv = vec![0f32; D];
    let (q_t, kv_t) = (Tensor::from_slice(&q, &[1, H, D]).unwrap(), Tensor::from_slice(&kv, &[1, 1, D]).unwrap());
    // A latent cache in the plain forward and the plain write.
    let mut out = vec![7f32; H * D];
    let opts = AttentionOptions { write_kv: false, ..AttentionOptions::new(H, 1, D) };
    let err = be.forward_with(ForwardArgs::new(&batch, &opts, &q_t, &mut TensorMut::from_slice(&mut out, &[1, H, D]).unwrap())
        .cache(&step.cache).layer(1)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(out.iter().all(|&x| x == 7.0));
    let err = step.cache.write(1, &kv_t, &kv_t, &Tensor::from_i64(&[0]), 1.0, 1.0).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    // A plain cache (one KV head of 64, rows that would be 32 + 32) in forward_mla and
    // write_latent.
    let plain = KvCache::new(&be, &CacheDesc { num_layers: 1, num_blocks: 4, block_size: 16, num_kv_heads: 1,
                                               head_size: 64, dtype: DType::F32, ..CacheDesc::default() }).unwrap();
    let plain_batch = Batch::new(&be, Some(&plain), None, &BatchDesc { query_lens: &[1], context_lens: &[20],
        block_tables: Some(&[2, 0]), block_table_stride: 2, ..BatchDesc::default() }).unwrap();
    let half = vec![1f32; H * 32];
    let half_t = Tensor::from_slice(&half, &[1, H, 32]).unwrap();
    let mut out = vec![7f32; H * 32];
    let err = be.forward_mla(&plain_batch, &plain, 0, &AttentionOptions::mla(H, 64), &half_t, Some(&half_t),
                             &mut TensorMut::from_slice(&mut out, &[1, H, 32]).unwrap(), None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(out.iter().all(|&x| x == 7.0)); // nothing written
    let row = Tensor::from_slice(&half[..32], &[1, 32]).unwrap();
    let err = plain.write_latent(0, &row, Some(&row), &Tensor::from_i64(&[0]), 1.0).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn write_latent_checks_its_arguments() {
    let be = cpu();
    let step = Step::new(&be, Dt::F32, &[(1, 3)], 16, 74, false);
    let rows = vec![0f32; 2 * D];
    let whole = Tensor::from_slice(&rows, &[2, D]).unwrap();
    let err = step.cache.write_latent(0, &whole, None, &Tensor::from_i64(&[0, 10_000]), 1.0).unwrap_err();
    assert_eq!(err.status, Status::OutOfRange);
    let err = step.cache.write_latent(1 << 32, &whole, None, &Tensor::from_i64(&[0, 1]), 1.0).unwrap_err();
    assert_eq!(err.status, Status::Overflow);
}
