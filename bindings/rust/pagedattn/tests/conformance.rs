//! The shared conformance suite (tests/conformance/FORMAT.md): each case's inputs, written by the
//! C runner, are run through this crate and must give byte-identical outputs and the same
//! refusals (status, failing step and message) as the C run.
//!
//! The case directory comes from PAGEDATTN_CONFORMANCE_DIR (run_tests.sh generates it); without
//! it the runner of the Meson build tree the library was found in is run into a temp directory.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use pagedattn::{check, sys, AttentionOptions, AttentionType, Backend, BackendOptions, Batch, BatchDesc,
                CacheDesc, DType, Error, KvCache, Layout, Tensor, TensorMut};

struct Meta(HashMap<String, String>);

impl Meta {
    fn load(dir: &Path) -> Meta {
        let text = fs::read_to_string(dir.join("meta.txt")).unwrap();
        Meta(text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| match l.split_once(' ') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (l.to_string(), String::new()),
            })
            .collect())
    }
    fn s(&self, key: &str) -> &str {
        self.0.get(key).unwrap_or_else(|| panic!("meta.txt lacks {key}"))
    }
    fn i(&self, key: &str) -> usize {
        self.s(key).parse().unwrap_or_else(|_| panic!("{key} = {}", self.s(key)))
    }
    fn f(&self, key: &str) -> f32 {
        self.s(key).parse().unwrap()
    }
    fn list(&self, key: &str) -> Vec<i32> {
        self.s(key).split_whitespace().map(|v| v.parse().unwrap()).collect()
    }
    fn dtype(&self, key: &str) -> DType {
        match self.s(key) {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "fp8_e4m3" => DType::Fp8E4M3,
            "fp8_e5m2" => DType::Fp8E5M2,
            other => panic!("dtype {other}"),
        }
    }
    fn layout(&self, key: &str) -> Layout {
        if self.s(key) == "hnd" { Layout::Hnd } else { Layout::Nhd }
    }
}

/// Host data of a q/k/v/out dtype in the Rust type that holds it.
enum Buf {
    F32(Vec<f32>),
    U16(Vec<u16>),
}

impl Buf {
    fn from_bytes(bytes: &[u8], dtype: DType) -> Buf {
        match dtype {
            DType::F32 => Buf::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
            _ => Buf::U16(bytes.chunks_exact(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()),
        }
    }
    fn poisoned(elems: usize, dtype: DType) -> Buf {
        match dtype {
            DType::F32 => Buf::F32(vec![f32::from_bits(u32::MAX); elems]),
            _ => Buf::U16(vec![u16::MAX; elems]),
        }
    }
    fn tensor(&self, dtype: DType, shape: &[usize]) -> Tensor<'_> {
        match self {
            Buf::F32(v) => Tensor::new(v, dtype, shape),
            Buf::U16(v) => Tensor::new(v, dtype, shape),
        }
        .unwrap()
    }
    fn tensor_mut(&mut self, dtype: DType, shape: &[usize]) -> TensorMut<'_> {
        match self {
            Buf::F32(v) => TensorMut::new(v, dtype, shape),
            Buf::U16(v) => TensorMut::new(v, dtype, shape),
        }
        .unwrap()
    }
    fn bytes(&self) -> Vec<u8> {
        match self {
            Buf::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buf::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

fn read_i32(path: PathBuf) -> Vec<i32> {
    fs::read(path).unwrap().chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn read_f32(path: PathBuf) -> Vec<f32> {
    fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn read_i64(path: PathBuf) -> Vec<i64> {
    fs::read(path).unwrap().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

fn read_all(cache: &KvCache<'_>) -> Result<Vec<u8>, Error> {
    let ids: Vec<i32> = (0..i32::try_from(cache.desc()?.num_blocks).unwrap()).collect();
    cache.read_blocks_to_vec(&ids)
}

/// Runs one case; returns why it does not match the C run.
fn run_case(dir: &Path) -> Result<(), String> {
    let m = Meta::load(dir);
    let file = |name: &str| dir.join(name);
    let has = |name: &str| file(name).exists();
    let (dtype, out_dtype, cache_dtype) = (m.dtype("dtype"), m.dtype("out_dtype"), m.dtype("cache_dtype"));
    let (nl, h, hkv, d) = (m.i("num_layers"), m.i("num_heads"), m.i("num_kv_heads"), m.i("head_size"));
    let (t, kv_rows, num_ctx) = (m.i("num_tokens"), m.i("kv_rows"), m.i("num_ctx"));
    let op = m.s("op").to_string();
    let attention = match m.s("attention") {
        "decoder" => AttentionType::Decoder,
        "encoder" => AttentionType::Encoder,
        "encoder_only" => AttentionType::EncoderOnly,
        "cross" => AttentionType::Cross,
        other => return Err(format!("attention {other}")),
    };
    let enc_only = attention == AttentionType::EncoderOnly;
    let pairs: Vec<[i32; 2]> = m.list("pairs").chunks_exact(2).map(|p| [p[0], p[1]]).collect();
    // Per-KV-head scales (head_scales 1): the context writes and the forward use them.
    let head_scales = m.i("head_scales") != 0;
    let (khs, vhs) = if head_scales {
        (read_f32(file("k_head_scales.bin")), read_f32(file("v_head_scales.bin")))
    } else {
        (Vec::new(), Vec::new())
    };
    let khs_t = Tensor::new(&khs, DType::F32, &[khs.len()]).unwrap();
    let vhs_t = Tensor::new(&vhs, DType::F32, &[vhs.len()]).unwrap();

    let mut out = Buf::poisoned(t * h * d, out_dtype);
    let mut lse = vec![f32::NAN; t * h];
    let mut slots_seen: Option<Vec<i64>> = None;
    let mut failure: Option<(&str, Error)> = None;
    let mut before: Option<Vec<u8>> = None;
    let refusal = m.s("expect") != "PAGEDATTN_OK";

    macro_rules! step {
        ($label:lifetime, $name:expr, $e:expr) => {
            match $e {
                Ok(v) => v,
                Err(err) => {
                    failure = Some(($name, err));
                    break $label;
                }
            }
        };
    }

    let opts = BackendOptions { num_threads: 1, ..Default::default() };
    let backend = match Backend::with_options(m.s("backend"), &opts) {
        Ok(b) => Some(b),
        Err(e) => {
            failure = Some(("backend_create", e));
            None
        }
    };
    let mut cache: Option<KvCache<'_>> = None;
    let mut dst: Option<KvCache<'_>> = None;
    'run: {
        let Some(backend) = backend.as_ref() else { break 'run };
        let desc = CacheDesc {
            num_layers: nl,
            num_blocks: m.i("num_blocks"),
            block_size: m.i("block_size"),
            num_kv_heads: hkv,
            head_size: d,
            dtype: cache_dtype,
            layout: m.layout("layout"),
            flags: 0,
        };
        if !enc_only {
            cache = Some(step!('run, "cache_create", KvCache::new(backend, &desc)));
        }
        if num_ctx > 0 {
            let c = cache.as_ref().unwrap();
            if refusal {
                before = Some(read_all(c).map_err(|e| e.to_string())?);
            }
            let (ctx_k, ctx_v) = (fs::read(file("ctx_k.bin")).unwrap(), fs::read(file("ctx_v.bin")).unwrap());
            let slots = read_i64(file("ctx_slots.bin"));
            let per_layer = num_ctx * hkv * d * dtype.size();
            for l in 0..nl {
                let k = Buf::from_bytes(&ctx_k[l * per_layer..][..per_layer], dtype);
                let v = Buf::from_bytes(&ctx_v[l * per_layer..][..per_layer], dtype);
                let shape = [num_ctx, hkv, d];
                let (kt, vt, st) = (k.tensor(dtype, &shape), v.tensor(dtype, &shape), Tensor::from_i64(&slots));
                if head_scales {
                    step!('run, "kv_cache_write", c.write_scaled(l, &kt, &vt, &st, Some(&khs_t), Some(&vhs_t)));
                } else {
                    step!('run, "kv_cache_write", c.write(l, &kt, &vt, &st, m.f("k_scale"), m.f("v_scale")));
                }
            }
        }
        // A refusal after the context write must leave the cache as the write left it.
        if refusal {
            if let Some(c) = cache.as_ref() {
                before = Some(read_all(c).map_err(|e| e.to_string())?);
            }
        }
        match op.as_str() {
            "forward" => {
                let tables = if enc_only { None } else { Some(read_i32(file("tables.bin"))) };
                let cross = attention == AttentionType::Cross;
                let (xtables, enc_lens) = if cross {
                    (Some(read_i32(file("cross_tables.bin"))), Some(m.list("encoder_lens")))
                } else {
                    (None, None)
                };
                let (qlens, clens) = (m.list("query_lens"), m.list("context_lens"));
                // Tree masks (tree 1) as the runner packed them: bytes and offsets.
                let (tree_mask, tree_indptr) = if m.i("tree") != 0 {
                    (Some(fs::read(file("tree_mask.bin")).unwrap()), Some(read_i64(file("tree_mask_indptr.bin"))))
                } else {
                    (None, None)
                };
                let bdesc = BatchDesc {
                    query_lens: &qlens,
                    context_lens: &clens,
                    block_tables: tables.as_deref(),
                    block_table_stride: m.i("table_stride"),
                    encoder_lens: enc_lens.as_deref(),
                    cross_block_tables: xtables.as_deref(),
                    cross_block_table_stride: m.i("cross_table_stride"),
                    tree_mask: tree_mask.as_deref(),
                    tree_mask_indptr: tree_indptr.as_deref(),
                    max_tree_mask_bytes: 0,
                    ..BatchDesc::default()
                };
                let cross_cache = if cross { cache.as_ref() } else { None };
                let batch = step!('run, "batch_create", Batch::new(backend, cache.as_ref(), cross_cache, &bdesc));
                slots_seen = Some(step!('run, "batch_get_slot_mapping", batch.slot_mapping()).to_vec());
                let slopes: Vec<f32> = if m.i("alibi") != 0 {
                    fs::read(file("alibi.bin")).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
                } else {
                    Vec::new()
                };
                let alibi = Tensor::new(&slopes, DType::F32, &[slopes.len()]).unwrap();
                let sinks = if m.i("sinks") != 0 { read_f32(file("sinks.bin")) } else { Vec::new() };
                let sinks_t = (m.i("sinks") != 0).then(|| Tensor::new(&sinks, DType::F32, &[m.i("sinks_len")]).unwrap());
                let options = AttentionOptions {
                    num_heads: h,
                    num_kv_heads: m.i("opt_num_kv_heads"),
                    head_size: d,
                    scale: m.f("scale"),
                    soft_cap: m.f("soft_cap"),
                    sliding_window: m.i("sliding_window"),
                    attention_type: attention,
                    write_kv: m.i("write_kv") != 0,
                    k_scale: m.f("k_scale"),
                    v_scale: m.f("v_scale"),
                    alibi_slopes: if m.i("alibi") != 0 { Some(&alibi) } else { None },
                    sinks: sinks_t.as_ref(),
                    attention_chunk: m.i("attention_chunk"),
                    k_head_scales: if head_scales { Some(&khs_t) } else { None },
                    v_head_scales: if head_scales { Some(&vhs_t) } else { None },
                    ..AttentionOptions::default()
                };
                let q = Buf::from_bytes(&fs::read(file("q.bin")).unwrap(), dtype);
                let (k, v) = if kv_rows > 0 {
                    (Some(Buf::from_bytes(&fs::read(file("k.bin")).unwrap(), dtype)),
                     Some(Buf::from_bytes(&fs::read(file("v.bin")).unwrap(), dtype)))
                } else {
                    (None, None)
                };
                let kv_shape = [kv_rows, hkv, d];
                let kt = k.as_ref().map(|b| b.tensor(dtype, &kv_shape));
                let vt = v.as_ref().map(|b| b.tensor(dtype, &kv_shape));
                let qt = q.tensor(dtype, &[t, h, d]);
                if refusal {
                    if let Some(c) = cache.as_ref() {
                        before = Some(read_all(c).map_err(|e| e.to_string())?);
                    }
                }
                let mut ot = out.tensor_mut(out_dtype, &[t, h, d]);
                let mut lt = TensorMut::new(&mut lse, DType::F32, &[t, h]).unwrap();
                let lse_arg = if m.i("lse") != 0 { Some(&mut lt) } else { None };
                if m.i("null_batch") != 0 {
                    // A NULL batch cannot be expressed safely; go through the raw API, as a
                    // caller mixing `sys` calls with this crate would.
                    let opts_raw = {
                        let mut o = sys::pagedattn_attention_options::default();
                        unsafe { sys::pagedattn_attention_options_init(&mut o) };
                        o.num_heads = i32::try_from(options.num_heads).unwrap();
                        o.num_kv_heads = i32::try_from(options.num_kv_heads).unwrap();
                        o.head_size = i32::try_from(options.head_size).unwrap();
                        o
                    };
                    let (qr, mut or) = (qt.as_raw(), ot.as_raw());
                    let kr = kt.as_ref().map(|x| x.as_raw());
                    let vr = vt.as_ref().map(|x| x.as_raw());
                    let status = unsafe {
                        sys::pagedattn_forward(backend.as_ptr(), std::ptr::null(),
                            cache.as_ref().map_or(std::ptr::null_mut(), |c| c.as_ptr()), i32::try_from(m.i("layer")).unwrap(),
                            &opts_raw, &qr, kr.as_ref().map_or(std::ptr::null(), |x| x as *const _),
                            vr.as_ref().map_or(std::ptr::null(), |x| x as *const _), &mut or,
                            std::ptr::null_mut(), std::ptr::null_mut())
                    };
                    step!('run, "forward", check(status));
                } else {
                    step!('run, "forward", backend.forward(&batch, cache.as_ref(), m.i("layer"), &options,
                          &qt, kt.as_ref(), vt.as_ref(), &mut ot, lse_arg));
                }
            }
            "copy_blocks" => {
                let c = cache.as_ref().unwrap();
                if refusal {
                    before = Some(read_all(c).map_err(|e| e.to_string())?);
                }
                step!('run, "copy_blocks", c.copy_blocks(&pairs));
            }
            "swap_blocks" => {
                let dd = CacheDesc { layout: m.layout("dst_layout"), num_blocks: m.i("dst_num_blocks"), ..desc };
                let dc = dst.insert(step!('run, "dst_cache_create", KvCache::new(backend, &dd)));
                if refusal {
                    before = Some(read_all(dc).map_err(|e| e.to_string())?);
                }
                step!('run, "swap_blocks", dc.swap_blocks_from(cache.as_ref().unwrap(), &pairs));
            }
            other => return Err(format!("unknown op {other}")),
        }
    }

    // Status, failing step and message must be the C run's.
    let (status, fail_step, message) = match &failure {
        None => ("PAGEDATTN_OK".to_string(), "none".to_string(), String::new()),
        Some((s, e)) => (e.status.name().to_string(), s.to_string(), e.message.replace(['\n', '\r'], " ")),
    };
    if status != m.s("status") || fail_step != m.s("fail_step") {
        return Err(format!("got {status} at {fail_step} ({message}), C got {} at {}", m.s("status"), m.s("fail_step")));
    }
    if message != m.s("message") {
        return Err(format!("message {message:?}, C said {:?}", m.s("message")));
    }
    let written = if op == "swap_blocks" { dst.as_ref() } else { cache.as_ref() };
    if let Some(c) = written {
        let now = read_all(c).map_err(|e| e.to_string())?;
        if has("cache.bin") && now != fs::read(file("cache.bin")).unwrap() {
            return Err("cache bytes differ from the C run's".into());
        }
        if let Some(b) = before {
            if b != now {
                return Err("a refused call changed the cache".into());
            }
        }
    }
    if failure.is_some() {
        if fail_step == "forward" && out.bytes().iter().any(|&b| b != 0xFF) {
            return Err("a refused forward wrote out".into());
        }
        return Ok(());
    }
    if has("slots.bin") && slots_seen.as_deref() != Some(&read_i64(file("slots.bin"))[..]) {
        return Err("slot mapping differs from the C run's".into());
    }
    if has("out.bin") && out.bytes() != fs::read(file("out.bin")).unwrap() {
        return Err("out bytes differ from the C run's".into());
    }
    if has("lse.bin") {
        let bytes: Vec<u8> = lse.iter().flat_map(|x| x.to_le_bytes()).collect();
        if bytes != fs::read(file("lse.bin")).unwrap() {
            return Err("lse bytes differ from the C run's".into());
        }
    }
    Ok(())
}

fn case_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PAGEDATTN_CONFORMANCE_DIR") {
        return PathBuf::from(dir);
    }
    // The Meson build tree next to the library this crate was linked with.
    let lib_dir = PathBuf::from(env!("PAGEDATTN_BUILD_LIB_DIR"));
    let runner = lib_dir.join("../tests/conformance/pagedattn-conformance");
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/conformance/cases.txt");
    assert!(runner.exists(), "no PAGEDATTN_CONFORMANCE_DIR and no runner at {}", runner.display());
    let out = std::env::temp_dir().join(format!("pagedattn-rust-conformance-{}", std::process::id()));
    let status = Command::new(&runner).arg(&cases).arg(&out).status().expect("cannot run the conformance runner");
    assert!(status.success(), "the C conformance runner failed");
    out
}

#[test]
fn conformance_cases_match_the_c_run() {
    let dir = case_dir();
    let index = fs::read_to_string(dir.join("index.txt")).expect("index.txt");
    let names: Vec<&str> = index.lines().filter(|l| !l.is_empty()).collect();
    assert!(names.len() >= 10, "only {} cases", names.len());
    let mut failed = Vec::new();
    for name in &names {
        match run_case(&dir.join(name)) {
            Ok(()) => println!("PASS {name}"),
            Err(why) => {
                println!("FAIL {name}: {why}");
                failed.push(format!("{name}: {why}"));
            }
        }
    }
    assert!(failed.is_empty(), "{} of {} cases differ:\n{}", failed.len(), names.len(), failed.join("\n"));
    // The refusals the issue names must be among the cases.
    for must in ["refuse_bad_block_id", "refuse_wrong_dtype", "refuse_short_table", "refuse_null_batch", "refuse_unknown_backend"] {
        assert!(names.contains(&must), "case {must} missing");
    }
}
