//! Speculative-decoding tree masks on a batch (docs/semantics.md 4.7) against a float64
//! reference: random draft trees over decode and chunked prefill sequences, the chain that equals
//! no mask, packing, updates, the refusals and the feature bit.

use pagedattn::{pack_tree_masks, AttentionOptions, AttentionType, Backend, Batch, BatchDesc, CacheDesc, DType, Features,
                ForwardArgs, KvCache, Layout, Status, Tensor, TensorMut};

const H: usize = 4;
const HKV: usize = 2;
const D: usize = 16;
const BS: usize = 4;
const NB: usize = 48;

/// Decode, chunked prefill, idle and plain prefill sequences: (query_len, context_len).
const MIX: &[(usize, usize)] = &[(1, 20), (6, 9), (1, 3), (0, 3), (9, 13), (4, 0)];

fn cpu() -> Backend {
    Backend::new("cpu").expect("cpu backend")
}

/// A xorshift generator: deterministic values and draws.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A value in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// A random draft tree over q tokens in topological order, row-major q x q: token r > 0 hangs
/// under a parent drawn from 0..r-1 and sees its parent's ancestors and itself.
fn draft_tree(q: usize, rng: &mut Rng) -> Vec<bool> {
    let mut m = vec![false; q * q];
    for r in 0..q {
        if r > 0 {
            let parent = (rng.next() % r as u64) as usize;
            let row: Vec<bool> = m[parent * q..][..q].to_vec();
            m[r * q..][..q].copy_from_slice(&row);
        }
        m[r * q + r] = true;
    }
    m
}

/// The chain (every token sees all earlier ones): the causal rule as a mask.
fn chain(q: usize) -> Vec<bool> {
    (0..q * q).map(|b| b % q <= b / q).collect()
}

/// One mask per sequence: a draft tree, or causal (None) for every third sequence and the idle.
fn trees(lens: &[(usize, usize)], seed: u64) -> Vec<Option<Vec<bool>>> {
    let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    lens.iter().enumerate().map(|(i, &(q, _))| (q > 0 && i % 3 != 2).then(|| draft_tree(q, &mut rng))).collect()
}

/// Sequences with every token's K/V, a cache holding the contexts and the step's q/k/v.
struct Scene {
    lens: Vec<(usize, usize)>,
    tables: Vec<i32>,
    stride: usize,
    keys: Vec<Vec<f32>>, // per sequence: [context + query][HKV][D]
    vals: Vec<Vec<f32>>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qlens: Vec<i32>,
    clens: Vec<i32>,
}

impl Scene {
    fn new(lens: &[(usize, usize)], seed: u64) -> Scene {
        let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
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
        let keys: Vec<Vec<f32>> = lens.iter().map(|&(q, c)| rng.values((q + c) * row)).collect();
        let vals: Vec<Vec<f32>> = lens.iter().map(|&(q, c)| rng.values((q + c) * row)).collect();
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (i, &(_, c)) in lens.iter().enumerate() {
            k.extend_from_slice(&keys[i][c * row..]);
            v.extend_from_slice(&vals[i][c * row..]);
        }
        let t: usize = lens.iter().map(|&(q, _)| q).sum();
        Scene {
            lens: lens.to_vec(),
            tables,
            stride,
            keys,
            vals,
            q: rng.values(t * H * D),
            k,
            v,
            qlens: lens.iter().map(|&(q, _)| q as i32).collect(),
            clens: lens.iter().map(|&(_, c)| c as i32).collect(),
        }
    }

    fn tokens(&self) -> usize {
        self.lens.iter().map(|&(q, _)| q).sum()
    }

    /// A cache holding every sequence's context.
    fn cache<'b>(&self, be: &'b Backend) -> KvCache<'b> {
        let cache = KvCache::new(be, &CacheDesc { num_layers: 1, num_blocks: NB, block_size: BS, num_kv_heads: HKV,
                                                  head_size: D, dtype: DType::F32, layout: Layout::Nhd, flags: 0 })
            .unwrap();
        let row = HKV * D;
        let (mut k, mut v, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &(_, c)) in self.lens.iter().enumerate() {
            k.extend_from_slice(&self.keys[i][..c * row]);
            v.extend_from_slice(&self.vals[i][..c * row]);
            slots.extend((0..c).map(|p| i64::from(self.tables[i * self.stride + p / BS]) * BS as i64 + (p % BS) as i64));
        }
        let n = slots.len();
        cache.write(0, &Tensor::from_slice(&k, &[n, HKV, D]).unwrap(), &Tensor::from_slice(&v, &[n, HKV, D]).unwrap(),
                    &Tensor::from_i64(&slots), 1.0, 1.0).unwrap();
        cache
    }

    /// The batch desc of this step, without masks.
    fn desc(&self) -> BatchDesc<'_> {
        BatchDesc { query_lens: &self.qlens, context_lens: &self.clens, block_tables: Some(&self.tables),
                    block_table_stride: self.stride, ..BatchDesc::default() }
    }

    /// Runs one decoder forward; returns (out, lse).
    fn forward(&self, be: &Backend, batch: &Batch, cache: &KvCache<'_>, opts: &AttentionOptions<'_>)
               -> Result<(Vec<f32>, Vec<f32>), pagedattn::Error> {
        let t = self.tokens();
        let (q, k, v) = (Tensor::from_slice(&self.q, &[t, H, D]).unwrap(), Tensor::from_slice(&self.k, &[t, HKV, D]).unwrap(),
                         Tensor::from_slice(&self.v, &[t, HKV, D]).unwrap());
        let mut out = vec![7.0f32; t * H * D];
        let mut lse = vec![f32::NAN; t * H];
        {
            let mut out_t = TensorMut::from_slice(&mut out, &[t, H, D]).unwrap();
            let mut lse_t = TensorMut::from_slice(&mut lse, &[t, H]).unwrap();
            let args = ForwardArgs::new(batch, opts, &q, &mut out_t).cache(cache).lse(&mut lse_t);
            be.forward_with(if opts.write_kv { args.kv(&k, &v) } else { args })?;
        }
        Ok((out, lse))
    }

    /// Float64 decoder attention with each sequence's tree mask (None: causal): (out, lse).
    fn reference(&self, masks: &[Option<Vec<bool>>]) -> (Vec<f64>, Vec<f64>) {
        let (t, row, scale) = (self.tokens(), HKV * D, 1.0 / (D as f64).sqrt());
        let (mut out, mut lse) = (vec![0f64; t * H * D], vec![0f64; t * H]);
        let mut r = 0;
        for (i, &(ql, cl)) in self.lens.iter().enumerate() {
            for j in 0..ql {
                let p = cl + j;
                // The context is always visible; new token j sees new token k - cl per the mask.
                let pos: Vec<usize> = (0..=p)
                    .filter(|&k| k < cl || masks[i].as_ref().is_none_or(|m| m[j * ql + (k - cl)]))
                    .collect();
                for h in 0..H {
                    let kh = h / (H / HKV);
                    let qv = &self.q[(r * H + h) * D..][..D];
                    let s: Vec<f64> = pos.iter().map(|&k| {
                        (0..D).map(|e| f64::from(qv[e]) * f64::from(self.keys[i][k * row + kh * D + e])).sum::<f64>() * scale
                    }).collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let total: f64 = w.iter().sum();
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

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn capabilities_announce_tree_masks() {
    assert_eq!(Features::TREE_MASK.0, 1 << 15);
    assert!(cpu().capabilities().unwrap().features.contains(Features::TREE_MASK));
}

#[test]
fn pack_tree_masks_packs_least_significant_bit_first() {
    let mut rng = Rng(5);
    let masks = [Some(draft_tree(5, &mut rng)), None, Some(draft_tree(1, &mut rng)), Some(draft_tree(8, &mut rng))];
    let (bytes, indptr) = pack_tree_masks(&masks).unwrap();
    assert_eq!(indptr, [0, 4, 4, 5, 13]);
    for (i, m) in masks.iter().enumerate() {
        let seg = &bytes[indptr[i] as usize..indptr[i + 1] as usize];
        match m {
            None => assert!(seg.is_empty()),
            Some(m) => {
                for (b, &set) in m.iter().enumerate() {
                    assert_eq!(seg[b / 8] >> (b % 8) & 1 == 1, set, "mask {i} bit {b}");
                }
                // Bits past q * q are zero.
                assert!(m.len() % 8 == 0 || seg[seg.len() - 1] >> (m.len() % 8) == 0);
            }
        }
    }
    let err = pack_tree_masks(&[Some(vec![true; 6])]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("square"), "{err}");
    assert_eq!(pack_tree_masks::<&[bool]>(&[None, None]).unwrap(), (vec![], vec![0, 0, 0]));
}

#[test]
fn draft_trees_match_the_reference() {
    let be = cpu();
    let sc = Scene::new(MIX, 1);
    let cache = sc.cache(&be);
    let masks = trees(MIX, 1);
    let (mask, indptr) = pack_tree_masks(&masks).unwrap();
    let batch = Batch::new(&be, Some(&cache), None, &BatchDesc { tree_mask: Some(&mask), tree_mask_indptr: Some(&indptr),
                                                                   ..sc.desc() }).unwrap();
    assert_eq!(batch.info().unwrap().max_tree_mask_bytes, mask.len());
    let (out, lse) = sc.forward(&be, &batch, &cache, &AttentionOptions::new(H, HKV, D)).unwrap();
    let (want, want_lse) = sc.reference(&masks);
    assert!(rel_err(&out, &want) <= 1e-5, "{}", rel_err(&out, &want));
    assert!(max_abs_diff(&lse, &want_lse) <= 1e-5);
    // The masks matter: the causal reference is far off.
    let causal: Vec<Option<Vec<bool>>> = vec![None; MIX.len()];
    assert!(rel_err(&out, &sc.reference(&causal).0) > 1e-2);

    // The SEQ length form takes the same masks.
    let seq_lens: Vec<i32> = MIX.iter().map(|&(q, c)| (q + c) as i32).collect();
    let mut starts = vec![0i32];
    for &(q, _) in MIX {
        starts.push(starts.last().unwrap() + q as i32);
    }
    let by_seq = Batch::new(&be, Some(&cache), None, &BatchDesc {
        query_lens: &[], context_lens: &[], seq_lens: Some(&seq_lens), query_start_loc: Some(&starts),
        tree_mask: Some(&mask), tree_mask_indptr: Some(&indptr), ..sc.desc()
    }).unwrap();
    let again = sc.forward(&be, &by_seq, &cache, &AttentionOptions::new(H, HKV, D)).unwrap();
    assert_eq!((bits(&again.0), bits(&again.1)), (bits(&out), bits(&lse)));
}

#[test]
fn chain_mask_equals_no_mask() {
    let be = cpu();
    let sc = Scene::new(MIX, 2);
    let cache = sc.cache(&be);
    let chains: Vec<Option<Vec<bool>>> = MIX.iter().map(|&(q, _)| Some(chain(q))).collect();
    let (mask, indptr) = pack_tree_masks(&chains).unwrap();
    let plain = Batch::new(&be, Some(&cache), None, &sc.desc()).unwrap();
    let masked = Batch::new(&be, Some(&cache), None, &BatchDesc { tree_mask: Some(&mask), tree_mask_indptr: Some(&indptr),
                                                                    ..sc.desc() }).unwrap();
    let opts = AttentionOptions::new(H, HKV, D);
    let (a, a_lse) = sc.forward(&be, &plain, &cache, &opts).unwrap();
    let (b, b_lse) = sc.forward(&be, &masked, &cache, &opts).unwrap();
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(bits(&a_lse), bits(&b_lse));
    assert!(rel_err(&a, &sc.reference(&chains).0) <= 1e-5);
}

#[test]
fn updates_take_masks_within_the_capacity() {
    let be = cpu();
    let sc = Scene::new(MIX, 3);
    let cache = sc.cache(&be);
    let masks = trees(MIX, 3);
    let (mask, indptr) = pack_tree_masks(&masks).unwrap();
    // Planned causal with room for the masks of later steps.
    let mut batch = Batch::new(&be, Some(&cache), None, &BatchDesc { max_tree_mask_bytes: mask.len(), ..sc.desc() }).unwrap();
    assert_eq!(batch.info().unwrap().max_tree_mask_bytes, mask.len());
    batch.update(&BatchDesc { tree_mask: Some(&mask), tree_mask_indptr: Some(&indptr), ..sc.desc() }).unwrap();
    let (out, _) = sc.forward(&be, &batch, &cache, &AttentionOptions::new(H, HKV, D)).unwrap();
    assert!(rel_err(&out, &sc.reference(&masks).0) <= 1e-5);
    // An update without masks is causal again: masks belong to the step.
    batch.update(&sc.desc()).unwrap();
    let read_only = AttentionOptions { write_kv: false, ..AttentionOptions::new(H, HKV, D) };
    let causal: Vec<Option<Vec<bool>>> = vec![None; MIX.len()];
    let (out, _) = sc.forward(&be, &batch, &cache, &read_only).unwrap();
    assert!(rel_err(&out, &sc.reference(&causal).0) <= 1e-5);
    // More bytes than planned: CAPACITY, and the batch keeps its contents.
    let chains: Vec<Option<Vec<bool>>> = MIX.iter().map(|&(q, _)| Some(chain(q))).collect();
    let (big, big_indptr) = pack_tree_masks(&chains).unwrap();
    assert!(big.len() > mask.len());
    let err = batch.update(&BatchDesc { tree_mask: Some(&big), tree_mask_indptr: Some(&big_indptr), ..sc.desc() }).unwrap_err();
    assert_eq!(err.status, Status::Capacity, "{err}");
    let (out, _) = sc.forward(&be, &batch, &cache, &read_only).unwrap();
    assert!(rel_err(&out, &sc.reference(&causal).0) <= 1e-5);
}

#[test]
fn malformed_masks_are_refused_by_the_library() {
    let be = cpu();
    let lens = [(1, 5), (4, 9), (3, 0)];
    let sc = Scene::new(&lens, 4);
    let cache = sc.cache(&be);
    let good = [Some(chain(1)), Some(chain(4)), None];
    let (mask, indptr) = pack_tree_masks(&good).unwrap();
    assert_eq!(indptr, [0, 1, 3, 3]);
    let mut diag = chain(4);
    diag[2 * 4 + 2] = false;
    let (diag, _) = pack_tree_masks(&[Some(chain(1)), Some(diag), None]).unwrap();
    let mut above = chain(4);
    above[4 + 3] = true;
    let (above, _) = pack_tree_masks(&[Some(chain(1)), Some(above), None]).unwrap();
    let shifted: Vec<u8> = std::iter::once(0).chain(mask.iter().copied()).collect();
    let shifted_indptr: Vec<i64> = indptr.iter().map(|o| o + 1).collect();
    let cases: [(&[u8], &[i64], &str); 5] = [
        (&diag, &indptr, "row 2 does not see itself"),
        (&above, &indptr, "row 1 sees the later token 3"),
        (&shifted, &shifted_indptr, "tree_mask_indptr[0] = 1"),
        (&mask, &[0, 1, 2, 2], "sequence 1's tree mask has 1 bytes"), // 1 byte for 4 x 4 bits
        (&mask, &[0, 1, 0, 3], "tree_mask_indptr[2] = 0"),
    ];
    let mut batch = Batch::new(&be, Some(&cache), None, &BatchDesc { max_tree_mask_bytes: 16, ..sc.desc() }).unwrap();
    let slots = batch.slot_mapping().unwrap().to_vec();
    for (m, ip, words) in cases {
        let desc = BatchDesc { tree_mask: Some(m), tree_mask_indptr: Some(ip), ..sc.desc() };
        let err = Batch::new(&be, Some(&cache), None, &desc).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.contains(words), "{err}");
        assert!(!err.message.starts_with("pagedattn (Rust binding)"), "{err}");
        // Update validates as create does, and keeps the batch's contents.
        let err = batch.update(&desc).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert_eq!(batch.slot_mapping().unwrap(), &slots[..]);
    }
}

#[test]
fn the_binding_refuses_what_the_library_would_read_past() {
    let be = cpu();
    let lens = [(1, 5), (4, 9), (3, 0)];
    let sc = Scene::new(&lens, 5);
    let cache = sc.cache(&be);
    let (mask, indptr) = pack_tree_masks(&[Some(chain(1)), Some(chain(4)), None]).unwrap();
    let cases = [
        (BatchDesc { tree_mask: Some(&mask), ..sc.desc() }, "go together"),
        (BatchDesc { tree_mask_indptr: Some(&indptr), ..sc.desc() }, "go together"),
        (BatchDesc { tree_mask: Some(&mask), tree_mask_indptr: Some(&indptr[..3]), ..sc.desc() }, "tree_mask_indptr has 3"),
        (BatchDesc { tree_mask: Some(&mask[..2]), tree_mask_indptr: Some(&indptr), ..sc.desc() },
         "tree_mask has 2 bytes, tree_mask_indptr reaches 3"),
    ];
    for (desc, words) in &cases {
        let err = Batch::new(&be, Some(&cache), None, desc).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.starts_with("pagedattn (Rust binding)") && err.message.contains(words), "{err}");
    }
    let huge = BatchDesc { max_tree_mask_bytes: usize::MAX, ..sc.desc() };
    assert_eq!(Batch::new(&be, Some(&cache), None, &huge).unwrap_err().status, Status::Overflow);
}

#[test]
fn a_tree_batch_takes_plain_decoder_attention_only() {
    let be = cpu();
    let lens = [(1, 5), (4, 9)];
    let sc = Scene::new(&lens, 6);
    let cache = sc.cache(&be);
    let mut rng = Rng(6);
    let (mask, indptr) = pack_tree_masks(&[None, Some(draft_tree(4, &mut rng))]).unwrap();
    let slopes: Vec<f32> = (0..H).map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / H as f32)).collect();
    let alibi = Tensor::from_slice(&slopes, &[H]).unwrap();
    let ids: Vec<i32> = (0..NB as i32).collect();
    let before = cache.read_blocks_to_vec(&ids).unwrap();
    let base = AttentionOptions::new(H, HKV, D);
    // Planned with masks, or only with room for them (an update could add them): both refuse.
    for desc in [BatchDesc { tree_mask: Some(&mask), tree_mask_indptr: Some(&indptr), ..sc.desc() },
                 BatchDesc { max_tree_mask_bytes: 2, ..sc.desc() }] {
        let batch = Batch::new(&be, Some(&cache), None, &desc).unwrap();
        for opts in [AttentionOptions { sliding_window: 4, ..base.clone() },
                     AttentionOptions { alibi_slopes: Some(&alibi), ..base.clone() },
                     AttentionOptions { attention_chunk: 8, ..base.clone() },
                     AttentionOptions { attention_type: AttentionType::Encoder, ..base.clone() }] {
            let err = sc.forward(&be, &batch, &cache, &opts).unwrap_err();
            assert_eq!(err.status, Status::InvalidArgument, "{err}");
            assert!(err.message.contains("tree masks"), "{err}");
        }
    }
    assert_eq!(cache.read_blocks_to_vec(&ids).unwrap(), before);
}
