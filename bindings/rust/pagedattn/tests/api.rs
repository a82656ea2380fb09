//! The safe API over the CPU backend: handles, errors, caches, batches, forward and merge.

use pagedattn::{backends, AttentionOptions, Backend, Batch, BatchDesc, CacheDesc, DType, DeviceType,
                Features, ForwardArgs, KvCache, Layout, Status, Stream, Tensor, TensorMut};

fn cpu() -> Backend {
    Backend::new("cpu").expect("cpu backend")
}

fn desc(layout: Layout) -> CacheDesc {
    CacheDesc { num_layers: 2, num_blocks: 8, block_size: 4, num_kv_heads: 2, head_size: 8,
                dtype: DType::F32, layout, flags: 0 }
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

#[test]
fn version_matches_headers() {
    let v = pagedattn::version();
    assert_eq!(v.major, pagedattn::HEADER_VERSION.major);
    assert_eq!(pagedattn::version_string(), v.to_string());
}

#[test]
fn backend_list_and_capabilities() {
    let list = backends().unwrap();
    let cpu_info = list.iter().find(|b| b.name == "cpu").expect("cpu listed");
    assert!(cpu_info.available && cpu_info.reason.is_empty());
    for b in list.iter().filter(|b| !b.available) {
        assert!(!b.reason.is_empty(), "{} unavailable without a reason", b.name);
    }
    let caps = cpu().capabilities().unwrap();
    assert_eq!(caps.name, "cpu");
    assert_eq!(caps.device.device_type, DeviceType::Cpu);
    assert!(caps.supports_dtype(DType::F32) && caps.supports_cache_dtype(DType::F32));
    assert!(caps.block_size_list().contains(&16) && caps.head_size_list().contains(&64));
    assert!(caps.features.contains(Features::LSE));
}

#[test]
fn unknown_backend_is_an_error_with_the_library_message() {
    let err = Backend::new("no-such-backend").unwrap_err();
    assert_eq!(err.status, Status::UnknownBackend);
    assert_eq!(err.status.name(), "PAGEDATTN_ERROR_UNKNOWN_BACKEND");
    assert!(err.message.contains("no-such-backend"), "message: {}", err.message);
    assert!(err.to_string().starts_with("PAGEDATTN_ERROR_UNKNOWN_BACKEND: "));
    // A name with an interior NUL never reaches C.
    assert_eq!(Backend::new("c\0pu").unwrap_err().status, Status::InvalidArgument);
}

#[test]
fn bad_options_are_refused() {
    let opts = pagedattn::BackendOptions { flags: 1, ..Default::default() };
    let err = Backend::with_options("cpu", &opts).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(!err.message.is_empty());
    let bad = CacheDesc { block_size: 3, ..desc(Layout::Nhd) };
    let err = bad.bytes_per_block().unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("block_size"), "message: {}", err.message);
    assert_eq!(KvCache::new(&cpu(), &bad).unwrap_err(), err);
}

#[test]
fn cache_geometry_and_layer_memory() {
    let be = cpu();
    for layout in [Layout::Nhd, Layout::Hnd] {
        let d = desc(layout);
        let cache = KvCache::new(&be, &d).unwrap();
        assert_eq!(cache.desc().unwrap(), d);
        assert_eq!(d.bytes_per_block().unwrap(), (2 * 2 * 4 * 2 * 8 * 4) as u64);
        let mem = cache.layer_memory(1).unwrap();
        assert_eq!(mem.strides, d.compact_strides().unwrap());
        assert!(!mem.k.is_null() && !mem.v.is_null());
        assert_eq!(cache.layer_memory(2).unwrap_err().status, Status::OutOfRange);
        // A new cache reads back as zeros.
        assert!(cache.read_blocks_to_vec(&[0, 7]).unwrap().iter().all(|&b| b == 0));
    }
}

#[test]
fn write_read_copy_load_blocks() {
    let be = cpu();
    let d = desc(Layout::Nhd);
    let cache = KvCache::new(&be, &d).unwrap();
    let (k, v) = (values(3 * 16, 1), values(3 * 16, 2));
    let slots = [5i64, -1, 30]; // block 1 slot 1; padding; block 7 slot 2
    cache.write(1, &Tensor::new(&k, DType::F32, &[3, 2, 8]).unwrap(),
                &Tensor::new(&v, DType::F32, &[3, 2, 8]).unwrap(), &Tensor::from_i64(&slots), 1.0, 1.0).unwrap();
    let block_elems = 4 * 2 * 8; // one K (or V) block of one layer
    let mut buf = vec![0f32; 2 * 2 * block_elems]; // one block id: 2 layers x {K, V}
    cache.read_blocks(&[1], &mut buf).unwrap();
    let layer1_k = &buf[2 * block_elems..3 * block_elems];
    let layer1_v = &buf[3 * block_elems..];
    assert_eq!(&layer1_k[16..32], &k[0..16]);
    assert_eq!(&layer1_v[16..32], &v[0..16]);
    assert!(buf[..2 * block_elems].iter().all(|&x| x == 0.0), "layer 0 untouched");

    // Out-of-range slot: refused, nothing written.
    let before = cache.read_blocks_to_vec(&(0..8).collect::<Vec<_>>()).unwrap();
    let err = cache.write(0, &Tensor::new(&k, DType::F32, &[3, 2, 8]).unwrap(),
        &Tensor::new(&v, DType::F32, &[3, 2, 8]).unwrap(), &Tensor::from_i32(&[0, 1, 32]), 1.0, 1.0).unwrap_err();
    assert_eq!(err.status, Status::OutOfRange);
    assert!(!err.message.is_empty());
    assert_eq!(cache.read_blocks_to_vec(&(0..8).collect::<Vec<_>>()).unwrap(), before);

    // Copy block 7 to 3 and check both layers moved.
    cache.copy_blocks(&[[7, 3]]).unwrap();
    assert_eq!(cache.read_blocks_to_vec(&[3]).unwrap(), cache.read_blocks_to_vec(&[7]).unwrap());
    assert_eq!(cache.copy_blocks(&[[0, 5], [1, 5]]).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(cache.copy_blocks(&[[0, 8]]).unwrap_err().status, Status::OutOfRange);

    // Load the exported block 1 into block 0 of another cache; swap it back into an HND cache.
    let exported = cache.read_blocks_to_vec(&[1]).unwrap();
    let other = KvCache::new(&be, &d).unwrap();
    other.load_blocks(&[0], &exported).unwrap();
    assert_eq!(other.read_blocks_to_vec(&[0]).unwrap(), exported);
    assert_eq!(other.load_blocks(&[0], &exported[1..]).unwrap_err().status, Status::InvalidArgument);
    let hnd = KvCache::new(&be, &CacheDesc { layout: Layout::Hnd, num_blocks: 2, ..d }).unwrap();
    hnd.swap_blocks_from(&other, &[[0, 1]]).unwrap();
    let back = KvCache::new(&be, &d).unwrap();
    back.swap_blocks_from(&hnd, &[[1, 6]]).unwrap();
    assert_eq!(back.read_blocks_to_vec(&[6]).unwrap(), exported);
}

#[test]
fn every_stream_taking_call_has_an_on_stream_form() {
    // The CPU backend ignores the stream; what matters is that each call passes it through and
    // behaves as its default-stream form.
    let be = cpu();
    let d = desc(Layout::Hnd);
    let cache = KvCache::new(&be, &d).unwrap();
    let (k, v) = (values(2 * 16, 3), values(2 * 16, 4));
    cache.write_on(Stream::DEFAULT, 0, &Tensor::new(&k, DType::F32, &[2, 2, 8]).unwrap(),
                   &Tensor::new(&v, DType::F32, &[2, 2, 8]).unwrap(), &Tensor::from_i64(&[9, 10]),
                   1.0, 1.0).unwrap();
    let exported = cache.read_blocks_to_vec_on(Stream::DEFAULT, &[2]).unwrap();
    assert_eq!(exported, cache.read_blocks_to_vec(&[2]).unwrap());
    let mut words = vec![0f32; exported.len() / 4];
    cache.read_blocks_on(Stream::DEFAULT, &[2], &mut words).unwrap();
    assert_eq!(words.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>(), exported);
    cache.load_blocks_on(Stream::DEFAULT, &[5], &words).unwrap();
    assert_eq!(cache.read_blocks_to_vec(&[5]).unwrap(), exported);
    let err = cache.load_blocks_on(Stream::DEFAULT, &[5, 5], &[exported.clone(), exported].concat())
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(cache.read_blocks_on(Stream::DEFAULT, &[8], &mut words).unwrap_err().status,
               Status::OutOfRange);
    cache.copy_blocks_on(Stream::DEFAULT, &[[5, 6]]).unwrap();
    let other = KvCache::new(&be, &d).unwrap();
    other.swap_blocks_from_on(Stream::DEFAULT, &cache, &[[6, 0]]).unwrap();
    assert_eq!(other.read_blocks_to_vec(&[0]).unwrap(), cache.read_blocks_to_vec(&[2]).unwrap());
    be.synchronize(Stream::DEFAULT).unwrap();
}

#[test]
fn wrapped_cache_writes_into_caller_memory() {
    let be = cpu();
    let d = CacheDesc { num_layers: 1, ..desc(Layout::Nhd) };
    let n = d.num_blocks * d.block_size * d.num_kv_heads * d.head_size;
    let (mut k_mem, mut v_mem) = (vec![0f32; n], vec![0f32; n]);
    let (k, v) = (values(16, 3), values(16, 4));
    {
        let cache = KvCache::wrap(&be, &d, vec![&mut k_mem[..]], vec![&mut v_mem[..]], None).unwrap();
        cache.write(0, &Tensor::new(&k, DType::F32, &[1, 2, 8]).unwrap(),
                    &Tensor::new(&v, DType::F32, &[1, 2, 8]).unwrap(), &Tensor::from_i64(&[9]), 1.0, 1.0).unwrap();
    }
    assert_eq!(&k_mem[9 * 16..10 * 16], &k[..]);
    assert_eq!(&v_mem[9 * 16..10 * 16], &v[..]);
    // Too-short memory and the wrong element type are refused before reaching C.
    let mut short = vec![0f32; n - 1];
    let mut v2 = vec![0f32; n];
    assert_eq!(KvCache::wrap(&be, &d, vec![&mut short[..]], vec![&mut v2[..]], None).unwrap_err().status,
               Status::InvalidArgument);
    let (mut a, mut b) = (vec![0u16; n], vec![0u16; n]);
    assert_eq!(KvCache::wrap(&be, &d, vec![&mut a[..]], vec![&mut b[..]], None).unwrap_err().status,
               Status::BadTensor);
}

#[test]
fn batch_plan_update_and_capacity() {
    let be = cpu();
    let cache = KvCache::new(&be, &desc(Layout::Nhd)).unwrap();
    let tables = [3, 5, 0, 6, 1, 2];
    let mut batch = Batch::new(&be, Some(&cache), None, &BatchDesc {
        query_lens: &[1, 3],
        context_lens: &[6, 2],
        block_tables: Some(&tables),
        block_table_stride: 3,
        max_num_seqs: 4,
        max_num_tokens: 8,
        max_blocks_per_seq: 3,
        ..BatchDesc::default()
    }).unwrap();
    let info = batch.info().unwrap();
    assert_eq!((info.num_seqs, info.num_tokens, info.num_decode_seqs, info.num_prefill_seqs), (2, 4, 1, 1));
    assert_eq!((info.max_query_len, info.max_seq_len, info.block_size), (3, 7, 4));
    // Position 6 of seq 0 -> table[1] = 5, slot 5*4+2; seq 1 positions 2,3,4 -> 6*4+2, 6*4+3, 1*4+0.
    assert_eq!(batch.slot_mapping().unwrap(), &[22, 26, 27, 4]);
    assert_eq!(batch.query_start().unwrap(), &[0, 1, 4]);
    assert!(batch.cross_slot_mapping().unwrap().is_empty());

    batch.update(&BatchDesc { query_lens: &[1], context_lens: &[0], block_tables: Some(&[7]),
                              block_table_stride: 1, ..BatchDesc::default() }).unwrap();
    assert_eq!(batch.slot_mapping().unwrap(), &[28]);
    let err = batch.update(&BatchDesc { query_lens: &[9], context_lens: &[0], block_tables: Some(&tables),
                                        block_table_stride: 3, ..BatchDesc::default() }).unwrap_err();
    assert_eq!(err.status, Status::Capacity);
    assert_eq!(batch.slot_mapping().unwrap(), &[28], "a failed update keeps the old contents");

    // Block id outside the cache; short table; mismatched lengths caught by the binding.
    let e = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[0],
        block_tables: Some(&[8]), block_table_stride: 1, ..BatchDesc::default() }).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange);
    let e = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[4],
        block_tables: Some(&[0]), block_table_stride: 1, ..BatchDesc::default() }).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange);
    let e = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1, 1], context_lens: &[0],
        ..BatchDesc::default() }).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("Rust binding"));
}

/// Decode with prefix in the cache, checked against a float64 reference; then lse and merging.
#[test]
fn forward_matches_reference_and_merge_states() {
    let be = cpu();
    let (h, hkv, dd) = (4usize, 2usize, 8usize);
    let d = CacheDesc { num_layers: 1, ..desc(Layout::Hnd) };
    let cache = KvCache::new(&be, &d).unwrap();
    let ctx = 6usize; // one sequence: 6 cached tokens in blocks 5, 2 + one new token
    let tables = [5, 2];
    let keys = values((ctx + 1) * hkv * dd, 10);
    let vals = values((ctx + 1) * hkv * dd, 11);
    let slots: Vec<i64> = (0..ctx).map(|p| i64::from(tables[p / 4]) * 4 + (p % 4) as i64).collect();
    let row = hkv * dd;
    cache.write(0, &Tensor::new(&keys[..ctx * row], DType::F32, &[ctx, hkv, dd]).unwrap(),
                &Tensor::new(&vals[..ctx * row], DType::F32, &[ctx, hkv, dd]).unwrap(),
                &Tensor::from_i64(&slots), 1.0, 1.0).unwrap();
    let batch = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[6],
        block_tables: Some(&tables), block_table_stride: 2, ..BatchDesc::default() }).unwrap();
    let q = values(h * dd, 12);
    let mut out = vec![f32::NAN; h * dd];
    let mut lse = vec![f32::NAN; h];
    let opts = AttentionOptions::new(h, hkv, dd);
    let (q_t, k_t, v_t) = (Tensor::new(&q, DType::F32, &[1, h, dd]).unwrap(),
                           Tensor::new(&keys[ctx * row..], DType::F32, &[1, hkv, dd]).unwrap(),
                           Tensor::new(&vals[ctx * row..], DType::F32, &[1, hkv, dd]).unwrap());
    let mut out_t = TensorMut::new(&mut out, DType::F32, &[1, h, dd]).unwrap();
    let mut lse_t = TensorMut::new(&mut lse, DType::F32, &[1, h]).unwrap();
    be.forward_with(ForwardArgs::new(&batch, &opts, &q_t, &mut out_t).cache(&cache).kv(&k_t, &v_t).lse(&mut lse_t))
        .unwrap();
    let scale = 1.0 / (dd as f64).sqrt();
    for hh in 0..h {
        let kh = hh / (h / hkv);
        let s: Vec<f64> = (0..=ctx).map(|p| (0..dd).map(|i| q[hh * dd + i] as f64 * keys[p * row + kh * dd + i] as f64).sum::<f64>() * scale).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
        assert!((lse[hh] as f64 - (m + sum.ln())).abs() < 1e-5, "lse head {hh}");
        for i in 0..dd {
            let r: f64 = (0..=ctx).map(|p| (s[p] - m).exp() / sum * vals[p * row + kh * dd + i] as f64).sum();
            assert!((out[hh * dd + i] as f64 - r).abs() < 1e-5, "out head {hh} dim {i}");
        }
    }
    // Wrong head count: refused, out untouched (through the positional form).
    let mut out2 = vec![f32::NAN; h * dd];
    let bad = AttentionOptions::new(h, 3, dd);
    let err = be.forward(&batch, Some(&cache), 0, &bad, &Tensor::new(&q, DType::F32, &[1, h, dd]).unwrap(),
        None, None, &mut TensorMut::new(&mut out2, DType::F32, &[1, h, dd]).unwrap(), None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(out2.iter().all(|x| x.is_nan()));

    // Merging a state with itself adds ln 2 to lse and keeps out; with an empty state keeps both.
    let mut merged = vec![0f32; h * dd];
    let mut merged_lse = vec![0f32; h];
    let o = Tensor::new(&out, DType::F32, &[1, h, dd]).unwrap();
    let l = Tensor::new(&lse, DType::F32, &[1, h]).unwrap();
    be.merge_states(&mut TensorMut::new(&mut merged, DType::F32, &[1, h, dd]).unwrap(),
                    Some(&mut TensorMut::new(&mut merged_lse, DType::F32, &[1, h]).unwrap()), &o, &l, &o, &l).unwrap();
    for i in 0..h * dd {
        assert!((merged[i] - out[i]).abs() < 1e-6);
    }
    for i in 0..h {
        assert!((merged_lse[i] - lse[i] - std::f32::consts::LN_2).abs() < 1e-5);
    }
    let empty = vec![f32::NEG_INFINITY; h];
    let zeros = vec![0f32; h * dd];
    be.merge_states(&mut TensorMut::new(&mut merged, DType::F32, &[1, h, dd]).unwrap(), None, &o, &l,
                    &Tensor::new(&zeros, DType::F32, &[1, h, dd]).unwrap(),
                    &Tensor::new(&empty, DType::F32, &[1, h]).unwrap()).unwrap();
    assert_eq!(merged, out);
}

#[test]
fn tensors_are_checked_before_reaching_c() {
    let data = vec![0f32; 10];
    assert_eq!(Tensor::new(&data, DType::F32, &[3, 3]).unwrap_err().status, Status::BadTensor);
    assert_eq!(Tensor::new(&data, DType::F16, &[10]).unwrap_err().status, Status::BadTensor);
    assert!(Tensor::with_strides(&data, DType::F32, &[2, 3], &[4, 1]).is_ok());
    assert_eq!(Tensor::with_strides(&data, DType::F32, &[2, 3], &[8, 1]).unwrap_err().status, Status::BadTensor);
    let halves = vec![0u16; 6];
    assert_eq!(Tensor::new(&halves, DType::BF16, &[2, 3]).unwrap().dtype(), DType::BF16.to_dlpack());
}

#[test]
fn dtypes_round_trip_through_dlpack() {
    for dt in DType::ALL {
        assert_eq!(DType::from_dlpack(dt.to_dlpack()).unwrap(), dt);
        assert!(!dt.name().is_empty());
    }
    assert_eq!(DType::F32.size(), 4);
    assert_eq!(DType::Fp8E5M2.size(), 1);
    let err = DType::from_dlpack(pagedattn::DataType::I32).unwrap_err();
    assert_eq!(err.status, Status::Unsupported);
}

#[test]
fn handles_are_send_and_sync_and_usable_from_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Backend>();
    assert_send_sync::<KvCache<'static>>();
    assert_send_sync::<Batch>();
    assert_send_sync::<ForwardArgs<'static, 'static, 'static>>();
    assert_send_sync::<Tensor<'static>>();
    assert_send_sync::<TensorMut<'static>>();
    assert_send_sync::<AttentionOptions<'static>>();
    let be = cpu();
    std::thread::scope(|s| {
        for seed in 0..2u64 {
            let be = &be;
            s.spawn(move || {
                let cache = KvCache::new(be, &desc(Layout::Nhd)).unwrap();
                let k = values(16, seed);
                cache.write(0, &Tensor::new(&k, DType::F32, &[1, 2, 8]).unwrap(),
                            &Tensor::new(&k, DType::F32, &[1, 2, 8]).unwrap(), &Tensor::from_i64(&[0]), 1.0, 1.0).unwrap();
                // Errors are per thread: this thread's failure carries its own message.
                assert_eq!(cache.copy_blocks(&[[0, 99]]).unwrap_err().status, Status::OutOfRange);
            });
        }
    });
}

#[test]
fn raw_calls_through_sys_report_errors() {
    // A NULL handle can only be passed through the raw API; `check` turns it into an Error.
    let err = pagedattn::check(unsafe { pagedattn::sys::pagedattn_kv_cache_copy_blocks(std::ptr::null_mut(), std::ptr::null(), 0, std::ptr::null_mut()) }).unwrap_err();
    assert_eq!(err.status, Status::NullPointer);
    assert!(!err.message.is_empty());
}

/// Runs `steps` decode steps of sequence `seq` (blocks 4*seq..4*seq+4) on `cache`, each writing
/// its new token; returns every step's output.
fn decode_steps(be: &Backend, cache: &KvCache<'_>, opts: &AttentionOptions<'_>, seq: usize, steps: usize) -> Vec<Vec<f32>> {
    let table: Vec<i32> = (0..4).map(|b| i32::try_from(4 * seq + b).unwrap()).collect();
    let context = 3 + 2 * seq; // tokens already cached
    (0..steps)
        .map(|step| {
            let ctx = i32::try_from(context + step).unwrap();
            let batch = Batch::new(be, Some(cache), None, &BatchDesc { query_lens: &[1], context_lens: &[ctx],
                block_tables: Some(&table), block_table_stride: 4, ..BatchDesc::default() }).unwrap();
            let seed = 100 * seq as u64 + step as u64;
            let (q, k, v) = (values(4 * 8, seed), values(2 * 8, seed + 1000), values(2 * 8, seed + 2000));
            let mut out = vec![f32::NAN; 4 * 8];
            be.forward(&batch, Some(cache), 0, opts, &Tensor::from_slice(&q, &[1, 4, 8]).unwrap(),
                       Some(&Tensor::from_slice(&k, &[1, 2, 8]).unwrap()), Some(&Tensor::from_slice(&v, &[1, 2, 8]).unwrap()),
                       &mut TensorMut::from_slice(&mut out, &[1, 4, 8]).unwrap(), None).unwrap();
            out
        })
        .collect()
}

/// A cache with the two sequences' contexts: 3 tokens in blocks 0.., 5 tokens in blocks 4...
fn two_sequence_cache(be: &Backend) -> KvCache<'_> {
    let cache = KvCache::new(be, &CacheDesc { num_layers: 1, ..desc(Layout::Nhd) }).unwrap();
    let slots = [0i64, 1, 2, 16, 17, 18, 19, 20];
    let (k, v) = (values(8 * 16, 7), values(8 * 16, 8));
    cache.write(0, &Tensor::from_slice(&k, &[8, 2, 8]).unwrap(), &Tensor::from_slice(&v, &[8, 2, 8]).unwrap(),
                &Tensor::from_i64(&slots), 1.0, 1.0).unwrap();
    cache
}

#[test]
fn two_threads_forward_on_one_cache() {
    // The C contract: forwards may share a cache when the blocks they touch are disjoint, each
    // with its own batch and output. Both threads write their new tokens into the one cache.
    let be = cpu();
    let opts = AttentionOptions::new(4, 2, 8);
    let steps = 6;
    let shared = two_sequence_cache(&be);
    let barrier = std::sync::Barrier::new(2);
    let concurrent: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|seq| {
                let (be, cache, opts, barrier) = (&be, &shared, &opts, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    decode_steps(be, cache, opts, seq, steps)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The same steps one after the other on a second cache give the same bits.
    let alone = two_sequence_cache(&be);
    for (seq, outs) in concurrent.iter().enumerate() {
        assert_eq!(outs, &decode_steps(&be, &alone, &opts, seq, steps), "sequence {seq}");
        assert!(outs.iter().flatten().all(|x| x.is_finite()));
    }
    let all: Vec<i32> = (0..8).collect();
    assert_eq!(shared.read_blocks_to_vec(&all).unwrap(), alone.read_blocks_to_vec(&all).unwrap());
}

#[test]
fn sizes_that_do_not_fit_c_are_refused() {
    let be = cpu();
    let big = usize::try_from(i32::MAX).unwrap() + 1;
    let overflow = |r: Result<(), pagedattn::Error>, what: &str| {
        let err = r.unwrap_err();
        assert_eq!(err.status, Status::Overflow, "{what}: {err}");
        assert!(err.message.contains(what), "{what}: {}", err.message);
    };
    let huge = CacheDesc { num_blocks: big, ..desc(Layout::Nhd) };
    overflow(huge.bytes_per_block().map(drop), "num_blocks = 2147483648 does not fit int32");
    overflow(KvCache::new(&be, &huge).map(drop), "num_blocks = 2147483648 does not fit int32");
    let opts = pagedattn::BackendOptions { num_threads: big, ..Default::default() };
    overflow(Backend::with_options("cpu", &opts).map(drop), "num_threads = 2147483648");

    // Layer 2^32 would be layer 0 once truncated: refused, and nothing is written.
    let cache = KvCache::new(&be, &desc(Layout::Nhd)).unwrap();
    let all: Vec<i32> = (0..8).collect();
    let before = cache.read_blocks_to_vec(&all).unwrap();
    let k = values(16, 5);
    let t = Tensor::from_slice(&k, &[1, 2, 8]).unwrap();
    overflow(cache.write(1 << 32, &t, &t, &Tensor::from_i64(&[0]), 1.0, 1.0), "layer = 4294967296");
    overflow(cache.layer_memory(1 << 32).map(drop), "layer = 4294967296");
    let batch = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[0],
        block_tables: Some(&[1]), block_table_stride: 1, ..BatchDesc::default() }).unwrap();
    let q = values(4 * 8, 6);
    let mut out = vec![0f32; 4 * 8];
    let mut run = |layer: usize, opts: &AttentionOptions<'_>| {
        be.forward(&batch, Some(&cache), layer, opts, &Tensor::from_slice(&q, &[1, 4, 8]).unwrap(), Some(&t), Some(&t),
                   &mut TensorMut::from_slice(&mut out, &[1, 4, 8]).unwrap(), None)
    };
    overflow(run(1 << 32, &AttentionOptions::new(4, 2, 8)), "layer = 4294967296");
    overflow(run(0, &AttentionOptions::new(4 + (1 << 32), 2, 8)), "num_heads = 4294967300");
    overflow(run(0, &AttentionOptions { sliding_window: big, ..AttentionOptions::new(4, 2, 8) }), "sliding_window");
    assert_eq!(cache.read_blocks_to_vec(&all).unwrap(), before);
    assert!(out.iter().all(|&x| x == 0.0));

    let desc_with = |f: &dyn Fn(&mut BatchDesc<'static>)| {
        let mut d = BatchDesc { query_lens: &[1], context_lens: &[0], block_tables: Some(&[1]), block_table_stride: 1,
                                ..BatchDesc::default() };
        f(&mut d);
        Batch::new(&be, Some(&cache), None, &d).map(drop)
    };
    overflow(desc_with(&|d| d.block_table_stride = 1 << 32), "block_table_stride = 4294967296");
    overflow(desc_with(&|d| d.max_num_tokens = usize::MAX), "max_num_tokens = 18446744073709551615 does not fit int64");
}

#[cfg(feature = "half")]
#[test]
fn half_slices_match_their_raw_bits() {
    use half::{bf16, f16};
    use pagedattn::Element;

    /// One decode step of a fresh cache of `dtype` over slices of `T`: the output and the block
    /// the step wrote.
    fn step<T: Element + Default>(be: &Backend, dtype: DType, q: &[T], kv: &[T]) -> (Vec<T>, Vec<u8>) {
        let cache = KvCache::new(be, &CacheDesc { num_layers: 1, dtype, ..desc(Layout::Nhd) }).unwrap();
        let batch = Batch::new(be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[0],
            block_tables: Some(&[3]), block_table_stride: 1, ..BatchDesc::default() }).unwrap();
        let mut out = vec![T::default(); q.len()];
        let kv_t = Tensor::new(kv, dtype, &[1, 2, 8]).unwrap();
        be.forward(&batch, Some(&cache), 0, &AttentionOptions::new(4, 2, 8), &Tensor::new(q, dtype, &[1, 4, 8]).unwrap(),
                   Some(&kv_t), Some(&kv_t), &mut TensorMut::new(&mut out, dtype, &[1, 4, 8]).unwrap(), None).unwrap();
        (out, cache.read_blocks_to_vec(&[3]).unwrap())
    }

    let be = cpu();
    let (q, kv) = (values(4 * 8, 30), values(2 * 8, 31));
    let (qb, kvb): (Vec<bf16>, Vec<bf16>) = (q.iter().map(|&x| bf16::from_f32(x)).collect(), kv.iter().map(|&x| bf16::from_f32(x)).collect());
    let (qh, kvh): (Vec<f16>, Vec<f16>) = (q.iter().map(|&x| f16::from_f32(x)).collect(), kv.iter().map(|&x| f16::from_f32(x)).collect());
    let (out_b, cache_b) = step(&be, DType::BF16, &qb, &kvb);
    let (out_bu, cache_bu) = step(&be, DType::BF16, &qb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                  &kvb.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(out_b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), out_bu);
    assert_eq!(cache_b, cache_bu);
    let (out_h, cache_h) = step(&be, DType::F16, &qh, &kvh);
    let (out_hu, cache_hu) = step(&be, DType::F16, &qh.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                  &kvh.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(out_h.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), out_hu);
    assert_eq!(cache_h, cache_hu);
    assert!(out_b.iter().all(|x| x.to_f32().is_finite()) && out_h.iter().all(|x| x.to_f32().is_finite()));

    // The type fixes the dtype; a mismatch is refused before reaching C.
    assert_eq!(Tensor::from_slice(&qb, &[1, 4, 8]).unwrap().dtype(), DType::BF16.to_dlpack());
    assert_eq!(Tensor::from_slice(&qh, &[1, 4, 8]).unwrap().dtype(), DType::F16.to_dlpack());
    assert_eq!(Tensor::new(&qh, DType::BF16, &[1, 4, 8]).unwrap_err().status, Status::BadTensor);
    assert_eq!(Tensor::new(&qb, DType::F16, &[1, 4, 8]).unwrap_err().status, Status::BadTensor);
    // A bfloat16 cache over the caller's bf16 memory.
    let d = CacheDesc { num_layers: 1, dtype: DType::BF16, ..desc(Layout::Nhd) };
    let n = d.num_blocks * d.block_size * d.num_kv_heads * d.head_size;
    let (mut km, mut vm) = (vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
    {
        let cache = KvCache::wrap(&be, &d, vec![&mut km[..]], vec![&mut vm[..]], None).unwrap();
        let row = Tensor::from_slice(&kvb, &[1, 2, 8]).unwrap();
        cache.write(0, &row, &row, &Tensor::from_i64(&[5]), 1.0, 1.0).unwrap();
    }
    assert_eq!(&km[5 * 16..6 * 16], &kvb[..]);
    assert!(KvCache::wrap(&be, &CacheDesc { dtype: DType::F16, ..d }, vec![&mut km[..]], vec![&mut vm[..]], None).is_err());
}

/// The three ways to pass a forward's arguments run the same call: positional, the builder and
/// a struct literal give the same bits.
#[test]
fn forward_args_builder_literal_and_positional_agree() {
    let be = cpu();
    let cache = KvCache::new(&be, &desc(Layout::Nhd)).unwrap();
    let ctx: Vec<f32> = values(5 * 16, 30);
    let ctx_t = Tensor::from_slice(&ctx, &[5, 2, 8]).unwrap();
    cache.write(1, &ctx_t, &ctx_t, &Tensor::from_i64(&[12, 13, 14, 15, 24]), 1.0, 1.0).unwrap();
    let batch = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[5],
        block_tables: Some(&[3, 6]), block_table_stride: 2, ..BatchDesc::default() }).unwrap();
    let (q, kv) = (values(32, 31), values(16, 32));
    let q_t = Tensor::from_slice(&q, &[1, 4, 8]).unwrap();
    let kv_t = Tensor::from_slice(&kv, &[1, 2, 8]).unwrap();
    let opts = AttentionOptions::new(4, 2, 8);
    let mut outs = vec![vec![f32::NAN; 32]; 3];
    let mut lses = vec![vec![f32::NAN; 4]; 3];
    for (i, (out, lse)) in outs.iter_mut().zip(lses.iter_mut()).enumerate() {
        let mut out_t = TensorMut::from_slice(out, &[1, 4, 8]).unwrap();
        let mut lse_t = TensorMut::from_slice(lse, &[1, 4]).unwrap();
        match i {
            0 => be.forward(&batch, Some(&cache), 1, &opts, &q_t, Some(&kv_t), Some(&kv_t), &mut out_t,
                            Some(&mut lse_t)),
            1 => be.forward_with(ForwardArgs::new(&batch, &opts, &q_t, &mut out_t).cache(&cache).layer(1)
                .kv(&kv_t, &kv_t).lse(&mut lse_t)),
            _ => be.forward_with(ForwardArgs { batch: &batch, cache: Some(&cache), layer: 1, options: &opts, q: &q_t,
                k: Some(&kv_t), v: Some(&kv_t), out: &mut out_t, lse: Some(&mut lse_t) }),
        }
        .unwrap();
    }
    assert!(outs[0].iter().chain(&lses[0]).all(|x| x.is_finite()));
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for i in 1..3 {
        assert_eq!(bits(&outs[i]), bits(&outs[0]), "out of form {i}");
        assert_eq!(bits(&lses[i]), bits(&lses[0]), "lse of form {i}");
    }
    // The defaults of `new`: layer 0, no cache, no k/v. Without the cache the library refuses
    // the decoder forward and writes nothing.
    let mut out = vec![f32::NAN; 32];
    let mut out_t = TensorMut::from_slice(&mut out, &[1, 4, 8]).unwrap();
    let args = ForwardArgs::new(&batch, &opts, &q_t, &mut out_t);
    assert!(args.cache.is_none() && args.k.is_none() && args.v.is_none() && args.lse.is_none() && args.layer == 0);
    assert_eq!(be.forward_with(args).unwrap_err().status, Status::NullPointer);
    assert!(out.iter().all(|x| x.is_nan()));
}

/// An engine that owns its cache and batch: built in a function whose backend goes out of
/// scope, moved to another thread, run there.
struct Engine {
    cache: KvCache<'static>,
    batch: Batch,
    opts: AttentionOptions<'static>,
}

fn engine() -> Engine {
    let be = cpu();
    let cache = KvCache::new(&be, &desc(Layout::Nhd)).unwrap();
    let ctx = vec![0.75f32; 3 * 16];
    let ctx_t = Tensor::from_slice(&ctx, &[3, 2, 8]).unwrap();
    cache.write(0, &ctx_t, &ctx_t, &Tensor::from_i64(&[20, 21, 22]), 1.0, 1.0).unwrap();
    let batch = Batch::new(&be, Some(&cache), None, &BatchDesc { query_lens: &[1], context_lens: &[3],
        block_tables: Some(&[5]), block_table_stride: 1, ..BatchDesc::default() }).unwrap();
    Engine { cache, batch, opts: AttentionOptions::new(4, 2, 8) }
}

#[test]
fn caches_and_batches_own_their_backend() {
    fn assert_owned<T: Send + Sync + 'static>(_: &T) {}
    let e = engine();
    assert_owned(&e.cache);
    assert_owned(&e.batch);
    assert!(e.cache.backend().same_as(e.batch.backend()));
    assert!(!e.cache.backend().same_as(&cpu()));
    let usage = e.batch.backend().memory_usage().unwrap();
    assert_eq!((usage.num_caches, usage.num_batches), (1, 1));

    let out = std::thread::spawn(move || {
        let (q, kv) = (values(32, 40), vec![0.75f32; 16]);
        let (q_t, kv_t) = (Tensor::from_slice(&q, &[1, 4, 8]).unwrap(), Tensor::from_slice(&kv, &[1, 2, 8]).unwrap());
        let mut out = vec![0f32; 32];
        let mut out_t = TensorMut::from_slice(&mut out, &[1, 4, 8]).unwrap();
        let args = ForwardArgs::new(&e.batch, &e.opts, &q_t, &mut out_t).cache(&e.cache).kv(&kv_t, &kv_t);
        e.cache.backend().forward_with(args).unwrap();
        out // `e` is dropped here: batch, cache, then the backend with its last handle
    })
    .join()
    .unwrap();
    // Every value is 0.75, so attention returns 0.75 whatever the weights.
    assert!(out.iter().all(|&x| (x - 0.75).abs() < 1e-6), "{out:?}");

    // Clones share one backend: dropping the one a cache was made from leaves it usable.
    let be = cpu();
    let other = be.clone();
    let cache = KvCache::new(&be, &desc(Layout::Hnd)).unwrap();
    drop(be);
    assert_eq!(other.memory_usage().unwrap().num_caches, 1);
    assert_eq!(cache.backend().memory_usage().unwrap().num_caches, 1);
    drop(cache);
    assert_eq!(other.memory_usage().unwrap().num_caches, 0);
}
