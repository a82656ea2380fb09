//! Attention sinks, chunked local attention and per-KV-head fp8 scales (the 0.2 options) against
//! a float64 reference, their refusals, the feature bits, and batches in the SEQ length form.

use pagedattn::{AttentionOptions, AttentionType, Backend, Batch, BatchDesc, CacheDesc, DType, Features,
                ForwardArgs, KvCache, Layout, Status, Stream, Tensor, TensorMut};

const H: usize = 4;
const HKV: usize = 2;
const D: usize = 16;
const BS: usize = 4;
const NB: usize = 32;

fn cpu() -> Backend {
    Backend::new("cpu").expect("cpu backend")
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n).map(|_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }).collect()
}

/// Multiples of 1/8 in [-7/8, 7/8]: x / s is exact in e4m3 and e5m2 for a power-of-two s, so an
/// fp8 cache holds x exactly and the reference needs no fp8 rounding.
fn exact_fp8_values(n: usize, seed: u64) -> Vec<f32> {
    values(n, seed).iter().map(|x| (x * 8.0).round().clamp(-7.0, 7.0) / 8.0).collect()
}

/// Sequences (query_len, context_len) with every token's K/V, a cache holding the contexts and
/// the step's q/k/v.
struct Scene {
    lens: Vec<(usize, usize)>,
    tables: Vec<i32>,
    stride: usize,
    keys: Vec<Vec<f32>>, // per sequence: [context + query][HKV][D]
    vals: Vec<Vec<f32>>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Scene {
    fn new(lens: &[(usize, usize)], seed: u64, exact: bool) -> Scene {
        let gen = |n, s| if exact { exact_fp8_values(n, s) } else { values(n, s) };
        let stride = lens.iter().map(|&(q, c)| (q + c).div_ceil(BS)).max().unwrap_or(1).max(1);
        // Blocks handed out in reverse order, so that tables are not the identity.
        let mut next = NB;
        let mut tables = vec![0i32; lens.len() * stride];
        for (i, &(q, c)) in lens.iter().enumerate() {
            for b in 0..(q + c).div_ceil(BS) {
                next -= 1;
                tables[i * stride + b] = next as i32;
            }
        }
        let row = HKV * D;
        let keys: Vec<Vec<f32>> = lens.iter().enumerate().map(|(i, &(q, c))| gen((q + c) * row, seed + 2 * i as u64)).collect();
        let vals: Vec<Vec<f32>> = lens.iter().enumerate().map(|(i, &(q, c))| gen((q + c) * row, seed + 2 * i as u64 + 1)).collect();
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (i, &(_, c)) in lens.iter().enumerate() {
            k.extend_from_slice(&keys[i][c * row..]);
            v.extend_from_slice(&vals[i][c * row..]);
        }
        let t: usize = lens.iter().map(|&(q, _)| q).sum();
        Scene { lens: lens.to_vec(), tables, stride, keys, vals, q: values(t * H * D, seed + 100), k, v }
    }

    fn tokens(&self) -> usize {
        self.lens.iter().map(|&(q, _)| q).sum()
    }

    fn slot(&self, seq: usize, pos: usize) -> i64 {
        i64::from(self.tables[seq * self.stride + pos / BS]) * BS as i64 + (pos % BS) as i64
    }

    /// The contexts' rows and their slots.
    fn context(&self) -> (Vec<f32>, Vec<f32>, Vec<i64>) {
        let row = HKV * D;
        let (mut k, mut v, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &(_, c)) in self.lens.iter().enumerate() {
            k.extend_from_slice(&self.keys[i][..c * row]);
            v.extend_from_slice(&self.vals[i][..c * row]);
            slots.extend((0..c).map(|p| self.slot(i, p)));
        }
        (k, v, slots)
    }

    fn cache<'b>(&self, be: &'b Backend, dtype: DType) -> KvCache<'b> {
        KvCache::new(be, &CacheDesc { num_layers: 1, num_blocks: NB, block_size: BS, num_kv_heads: HKV,
                                       head_size: D, dtype, layout: Layout::Nhd, flags: 0 }).unwrap()
    }

    fn query_lens(&self) -> Vec<i32> {
        self.lens.iter().map(|&(q, _)| q as i32).collect()
    }

    fn context_lens(&self) -> Vec<i32> {
        self.lens.iter().map(|&(_, c)| c as i32).collect()
    }

    fn batch(&self, be: &Backend, cache: &KvCache<'_>) -> Batch {
        let (q, c) = (self.query_lens(), self.context_lens());
        Batch::new(be, Some(cache), None, &BatchDesc { query_lens: &q, context_lens: &c, block_tables: Some(&self.tables),
                                                       block_table_stride: self.stride, ..BatchDesc::default() }).unwrap()
    }

    /// Runs one decoder forward; returns (out, lse).
    fn forward(&self, be: &Backend, batch: &Batch, cache: &KvCache<'_>, opts: &AttentionOptions<'_>) -> Result<(Vec<f32>, Vec<f32>), pagedattn::Error> {
        let t = self.tokens();
        let (q, k, v) = (Tensor::from_slice(&self.q, &[t, H, D]).unwrap(), Tensor::from_slice(&self.k, &[t, HKV, D]).unwrap(),
                         Tensor::from_slice(&self.v, &[t, HKV, D]).unwrap());
        let mut out = vec![f32::NAN; t * H * D];
        let mut lse = vec![f32::NAN; t * H];
        {
            let mut out_t = TensorMut::from_slice(&mut out, &[t, H, D]).unwrap();
            let mut lse_t = TensorMut::from_slice(&mut lse, &[t, H]).unwrap();
            be.forward_with(ForwardArgs::new(batch, opts, &q, &mut out_t).cache(cache).kv(&k, &v).lse(&mut lse_t))?;
        }
        Ok((out, lse))
    }

    /// Float64 decoder attention with optional sinks and attention chunk: (out, lse).
    fn reference(&self, sinks: Option<&[f32]>, chunk: usize) -> (Vec<f64>, Vec<f64>) {
        let (t, row, scale) = (self.tokens(), HKV * D, 1.0 / (D as f64).sqrt());
        let (mut out, mut lse) = (vec![0f64; t * H * D], vec![0f64; t * H]);
        let mut r = 0;
        for (i, &(ql, cl)) in self.lens.iter().enumerate() {
            for j in 0..ql {
                let p = cl + j;
                let pos: Vec<usize> = (0..=p).filter(|&k| chunk == 0 || k / chunk == p / chunk).collect();
                for h in 0..H {
                    let kh = h / (H / HKV);
                    let qv = &self.q[(r * H + h) * D..][..D];
                    let s: Vec<f64> = pos.iter().map(|&k| {
                        (0..D).map(|e| f64::from(qv[e]) * f64::from(self.keys[i][k * row + kh * D + e])).sum::<f64>() * scale
                    }).collect();
                    let sink = sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
                    let m = s.iter().cloned().fold(sink, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let total = w.iter().sum::<f64>() + (sink - m).exp();
                    for e in 0..D {
                        let acc: f64 = pos.iter().zip(&w).map(|(&k, w)| w * f64::from(self.vals[i][k * row + kh * D + e])).sum();
                        out[(r * H + h) * D + e] = acc / total;
                    }
                    lse[r * H + h] = m + total.ln();
                }
                r += 1;
            }
        }
        (out, lse)
    }
}

/// max|got - want| / max|want|.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let worst = got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max);
    worst / want.iter().map(|w| w.abs()).fold(1e-30, f64::max)
}

fn max_abs_diff(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max)
}

/// The decode / chunked prefill / prefill mix of every test here.
const MIX: &[(usize, usize)] = &[(1, 20), (6, 9), (0, 3), (5, 0), (1, 13)];

#[test]
fn capabilities_announce_the_new_options() {
    let caps = cpu().capabilities().unwrap();
    for f in [Features::SINKS, Features::CHUNKED_LOCAL, Features::HEAD_SCALES] {
        assert!(caps.features.contains(f), "{f:?}");
    }
    assert_eq!((Features::SINKS.0, Features::CHUNKED_LOCAL.0, Features::HEAD_SCALES.0), (1 << 12, 1 << 13, 1 << 14));
}

#[test]
fn sinks_and_attention_chunk_match_the_reference() {
    let be = cpu();
    let sc = Scene::new(MIX, 1, false);
    let sinks: Vec<f32> = values(H, 7).iter().map(|x| 1.0 + 3.0 * x).collect(); // in [-2, 4)
    let sinks_t = Tensor::from_slice(&sinks, &[H]).unwrap();
    for (with_sinks, chunk) in [(true, 0), (false, 4), (false, 7), (true, 5), (false, 0)] {
        let cache = sc.cache(&be, DType::F32);
        let (k, v, slots) = sc.context();
        let n = slots.len();
        cache.write(0, &Tensor::from_slice(&k, &[n, HKV, D]).unwrap(), &Tensor::from_slice(&v, &[n, HKV, D]).unwrap(),
                    &Tensor::from_i64(&slots), 1.0, 1.0).unwrap();
        let batch = sc.batch(&be, &cache);
        let opts = AttentionOptions { sinks: with_sinks.then_some(&sinks_t), attention_chunk: chunk,
                                      ..AttentionOptions::new(H, HKV, D) };
        let (out, lse) = sc.forward(&be, &batch, &cache, &opts).unwrap();
        let (want, want_lse) = sc.reference(with_sinks.then_some(&sinks[..]), chunk);
        assert!(rel_err(&out, &want) <= 1e-5, "sinks {with_sinks} chunk {chunk}: {}", rel_err(&out, &want));
        assert!(max_abs_diff(&lse, &want_lse) <= 1e-5, "lse, sinks {with_sinks} chunk {chunk}");
        if with_sinks || chunk > 0 {
            // The option matters: the plain reference is far off.
            assert!(rel_err(&out, &sc.reference(None, 0).0) > 1e-3);
        }
    }
}

fn fp8_decode(byte: u8, dtype: DType) -> f64 {
    let (ebits, mbits) = if dtype == DType::Fp8E4M3 { (4, 3) } else { (5, 2) };
    let bias = (1 << (ebits - 1)) - 1;
    let e = i32::from(byte >> mbits) & ((1 << ebits) - 1);
    let m = f64::from(byte & ((1 << mbits) - 1)) / f64::from(1u8 << mbits);
    let mag = if e == 0 { m * 2f64.powi(1 - bias) } else { (1.0 + m) * 2f64.powi(e - bias) };
    if byte & 0x80 != 0 { -mag } else { mag }
}

#[test]
fn head_scales_write_and_forward_match_the_reference() {
    let be = cpu();
    let sc = Scene::new(MIX, 2, true);
    let khs = [0.25f32, 4.0];
    let vhs = [2.0f32, 0.5];
    let (khs_t, vhs_t) = (Tensor::from_slice(&khs, &[HKV]).unwrap(), Tensor::from_slice(&vhs, &[HKV]).unwrap());
    for dtype in [DType::Fp8E4M3, DType::Fp8E5M2] {
        let cache = sc.cache(&be, dtype);
        let (k, v, slots) = sc.context();
        let n = slots.len();
        let (kt, vt) = (Tensor::from_slice(&k, &[n, HKV, D]).unwrap(), Tensor::from_slice(&v, &[n, HKV, D]).unwrap());
        cache.write_scaled(0, &kt, &vt, &Tensor::from_i64(&slots), Some(&khs_t), Some(&vhs_t)).unwrap();
        // The cache holds fp8(x / scale[h]): check the first context token of the first sequence.
        let block = sc.tables[0];
        let bytes = cache.read_blocks_to_vec(&[block]).unwrap();
        let per_side = BS * HKV * D;
        for h in 0..HKV {
            for e in 0..D {
                assert_eq!(fp8_decode(bytes[h * D + e], dtype), f64::from(k[h * D + e] / khs[h]), "K head {h}");
                assert_eq!(fp8_decode(bytes[per_side + h * D + e], dtype), f64::from(v[h * D + e] / vhs[h]), "V head {h}");
            }
        }
        // The step's tokens are written with the per-head scales too, then read back through them.
        let batch = sc.batch(&be, &cache);
        let opts = AttentionOptions { k_head_scales: Some(&khs_t), v_head_scales: Some(&vhs_t),
                                      ..AttentionOptions::new(H, HKV, D) };
        let (out, lse) = sc.forward(&be, &batch, &cache, &opts).unwrap();
        let (want, want_lse) = sc.reference(None, 0);
        // fp8 caches may compute in bfloat16 (docs/semantics.md section 7): the fp8 tolerance.
        assert!(rel_err(&out, &want) <= 6e-2, "{dtype:?}: {}", rel_err(&out, &want));
        assert!(max_abs_diff(&lse, &want_lse) <= 6e-2);
        // Read with the scalar scales (1) instead, the cache gives another result.
        let plain = AttentionOptions { write_kv: false, ..AttentionOptions::new(H, HKV, D) };
        let t = sc.tokens();
        let q = Tensor::from_slice(&sc.q, &[t, H, D]).unwrap();
        let mut wrong = vec![0f32; t * H * D];
        be.forward_with(ForwardArgs::new(&batch, &plain, &q, &mut TensorMut::from_slice(&mut wrong, &[t, H, D]).unwrap())
            .cache(&cache)).unwrap();
        assert!(rel_err(&wrong, &want) > 0.5);
    }
}

#[test]
fn equal_head_scales_store_what_a_scalar_scale_stores() {
    let be = cpu();
    let sc = Scene::new(&[(1, 16)], 3, false);
    let (k, v, slots) = sc.context();
    let (kt, vt, st) = (Tensor::from_slice(&k, &[16, HKV, D]).unwrap(), Tensor::from_slice(&v, &[16, HKV, D]).unwrap(),
                        Tensor::from_i64(&slots));
    let scalar = sc.cache(&be, DType::Fp8E4M3);
    scalar.write(0, &kt, &vt, &st, 0.003, 1.0).unwrap();
    let per_head = sc.cache(&be, DType::Fp8E4M3);
    let ks = [0.003f32; HKV];
    // Through the stream form; a `None` side has scale 1.
    per_head.write_scaled_on(Stream::DEFAULT, 0, &kt, &vt, &st, Some(&Tensor::from_slice(&ks, &[HKV]).unwrap()), None)
        .unwrap();
    let ids: Vec<i32> = (0..NB as i32).collect();
    assert_eq!(scalar.read_blocks_to_vec(&ids).unwrap(), per_head.read_blocks_to_vec(&ids).unwrap());
}

#[test]
fn refusals_write_nothing() {
    let be = cpu();
    let sc = Scene::new(&[(1, 5), (2, 0)], 4, false);
    let cache = sc.cache(&be, DType::Fp8E4M3);
    let batch = sc.batch(&be, &cache);
    let ids: Vec<i32> = (0..NB as i32).collect();
    let before = cache.read_blocks_to_vec(&ids).unwrap();
    let short = vec![0f32; H - 1];
    let short_t = Tensor::from_slice(&short, &[H - 1]).unwrap();
    let zero = [1.0f32, 0.0];
    let zero_t = Tensor::from_slice(&zero, &[HKV]).unwrap();
    let base = AttentionOptions::new(H, HKV, D);
    let cases = [
        (AttentionOptions { sinks: Some(&short_t), ..base.clone() }, Status::BadTensor),
        (AttentionOptions { attention_chunk: 4, attention_type: AttentionType::Encoder, ..base.clone() }, Status::InvalidArgument),
        (AttentionOptions { k_head_scales: Some(&zero_t), ..base.clone() }, Status::InvalidArgument),
        (AttentionOptions { v_head_scales: Some(&short_t), ..base.clone() }, Status::BadTensor),
    ];
    for (opts, status) in &cases {
        let err = sc.forward(&be, &batch, &cache, opts).unwrap_err();
        assert_eq!(err.status, *status, "{err}");
        assert!(!err.message.is_empty());
    }
    let (k, v) = (values(HKV * D, 5), values(HKV * D, 6));
    let (kt, vt) = (Tensor::from_slice(&k, &[1, HKV, D]).unwrap(), Tensor::from_slice(&v, &[1, HKV, D]).unwrap());
    let err = cache.write_scaled(0, &kt, &vt, &Tensor::from_i64(&[3]), None, Some(&zero_t)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(cache.read_blocks_to_vec(&ids).unwrap(), before);
    // A chunk that does not fit int32 is refused before the library is called.
    let huge = AttentionOptions { attention_chunk: 1 << 31, ..base };
    assert_eq!(sc.forward(&be, &batch, &cache, &huge).unwrap_err().status, Status::Overflow);
}

#[test]
fn seq_form_plans_the_same_batch() {
    let be = cpu();
    let sc = Scene::new(MIX, 8, false);
    let cache = sc.cache(&be, DType::F32);
    let (k, v, slots) = sc.context();
    let n = slots.len();
    cache.write(0, &Tensor::from_slice(&k, &[n, HKV, D]).unwrap(), &Tensor::from_slice(&v, &[n, HKV, D]).unwrap(),
                &Tensor::from_i64(&slots), 1.0, 1.0).unwrap();
    let by_context = sc.batch(&be, &cache);
    let seq_lens: Vec<i32> = sc.lens.iter().map(|&(q, c)| (q + c) as i32).collect();
    let mut starts = vec![0i32];
    for &(q, _) in &sc.lens {
        starts.push(starts.last().unwrap() + q as i32);
    }
    let desc = BatchDesc { seq_lens: Some(&seq_lens), query_start_loc: Some(&starts), block_tables: Some(&sc.tables),
                           block_table_stride: sc.stride, ..BatchDesc::default() };
    let by_seq = Batch::new(&be, Some(&cache), None, &desc).unwrap();
    assert_eq!(by_seq.query_start().unwrap(), &starts[..]);
    assert_eq!(by_seq.slot_mapping().unwrap(), by_context.slot_mapping().unwrap());
    assert_eq!(by_seq.info().unwrap(), by_context.info().unwrap());
    let opts = AttentionOptions { write_kv: false, ..AttentionOptions::new(H, HKV, D) };
    let t = sc.tokens();
    let q = Tensor::from_slice(&sc.q, &[t, H, D]).unwrap();
    let mut outs = [vec![0f32; t * H * D], vec![0f32; t * H * D]];
    for (batch, out) in [&by_context, &by_seq].into_iter().zip(outs.iter_mut()) {
        be.forward_with(ForwardArgs::new(batch, &opts, &q, &mut TensorMut::from_slice(out, &[t, H, D]).unwrap()).cache(&cache))
            .unwrap();
    }
    assert_eq!(outs[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), outs[1].iter().map(|x| x.to_bits()).collect::<Vec<_>>());

    // Updates take either form; a caller slot mapping is sized by query_start_loc's last entry.
    let mut by_seq = by_seq;
    let (ql, cl) = (sc.query_lens(), sc.context_lens());
    by_seq.update(&BatchDesc { query_lens: &ql, context_lens: &cl, block_tables: Some(&sc.tables),
                               block_table_stride: sc.stride, ..BatchDesc::default() }).unwrap();
    let planned = by_context.slot_mapping().unwrap().to_vec();
    by_seq.update(&BatchDesc { slot_mapping: Some(&planned), ..desc }).unwrap();
    assert_eq!(by_seq.slot_mapping().unwrap(), &planned[..]);
    let err = by_seq.update(&BatchDesc { slot_mapping: Some(&planned[1..]), ..desc }).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn seq_form_mistakes_are_refused() {
    let be = cpu();
    let sc = Scene::new(&[(1, 5), (2, 0)], 9, false);
    let cache = sc.cache(&be, DType::F32);
    let tables = Some(&sc.tables[..]);
    let stride = sc.stride;
    let seq = BatchDesc { seq_lens: Some(&[6, 2]), query_start_loc: Some(&[0, 1, 3]), block_tables: tables,
                          block_table_stride: stride, ..BatchDesc::default() };
    Batch::new(&be, Some(&cache), None, &seq).unwrap();
    let binding_side = [
        BatchDesc { query_lens: &[1, 2], context_lens: &[5, 0], ..seq },   // both forms
        BatchDesc { query_start_loc: None, ..seq },                        // seq_lens alone
        BatchDesc { seq_lens: None, ..seq },                               // query_start_loc alone
        BatchDesc { query_start_loc: Some(&[0, 1]), ..seq },               // num_seqs + 1 entries
    ];
    for desc in &binding_side {
        let err = Batch::new(&be, Some(&cache), None, desc).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.starts_with("pagedattn (Rust binding)"), "{err}");
    }
    let library_side = [
        BatchDesc { query_start_loc: Some(&[1, 1, 3]), ..seq },            // [0] != 0
        BatchDesc { query_start_loc: Some(&[0, 2, 1]), ..seq },            // decreasing
        BatchDesc { seq_lens: Some(&[6, 1]), ..seq },                      // below the query length
    ];
    for desc in &library_side {
        let err = Batch::new(&be, Some(&cache), None, desc).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.contains("query_start_loc") || err.message.contains("seq_lens"), "{err}");
    }
}
