//! Backends: listing, creating, capabilities, and the per-layer calls.

use std::ffi::CString;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::attention::{AttentionOptions, ForwardArgs, MlaForwardArgs};
use crate::batch::Batch;
use crate::cache::KvCache;
use crate::tensor::{Device, Stream, Tensor, TensorMut};
use crate::{check, from_c, owned_str, static_str, sys, to_c_i32, DType, Error, Result, Status};

/// One entry of the backend list ([`backends`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// "cpu", "onednn", "cuda", "hip".
    pub name: String,
    /// Whether [`Backend::new`] can succeed with device 0.
    pub available: bool,
    /// Why it is unavailable ("" when available).
    pub reason: String,
}

/// Every backend the library knows of, available or not (loading and probing plugins).
pub fn backends() -> Result<Vec<BackendInfo>> {
    // SAFETY: no arguments; cannot fail.
    let count = unsafe { sys::pagedattn_backend_count() };
    (0..count)
        .map(|index| {
            let mut info = sys::pagedattn_backend_info {
                struct_size: std::mem::size_of::<sys::pagedattn_backend_info>() as u32,
                ..Default::default()
            };
            // SAFETY: valid out struct with its size set.
            check(unsafe { sys::pagedattn_backend_get_info(&mut info, index) })?;
            // SAFETY: the strings are static and owned by the library.
            Ok(BackendInfo {
                name: unsafe { static_str(info.name) }.to_string(),
                available: info.available != 0,
                reason: unsafe { static_str(info.reason) }.to_string(),
            })
        })
        .collect()
}

/// Options for [`Backend::with_options`]; `Default` matches `pagedattn_backend_options_init`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendOptions {
    /// GPU ordinal; 0 on CPU.
    pub device_index: usize,
    /// CPU backends: worker threads, 0 = one per online core.
    pub num_threads: usize,
    /// Reserved, must be 0.
    pub flags: u32,
    /// Upper bound on bytes for caches and batch workspaces (0 = unlimited).
    pub memory_limit: u64,
}

/// Feature bits of a backend (`PAGEDATTN_FEATURE_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Features(pub u32);

impl Features {
    /// ALiBi slopes.
    pub const ALIBI: Features = Features(sys::PAGEDATTN_FEATURE_ALIBI);
    /// Logit soft cap.
    pub const SOFT_CAP: Features = Features(sys::PAGEDATTN_FEATURE_SOFT_CAP);
    /// Sliding window.
    pub const SLIDING_WINDOW: Features = Features(sys::PAGEDATTN_FEATURE_SLIDING_WINDOW);
    /// Cross attention.
    pub const CROSS_ATTENTION: Features = Features(sys::PAGEDATTN_FEATURE_CROSS_ATTENTION);
    /// Encoder and encoder-only attention.
    pub const ENCODER: Features = Features(sys::PAGEDATTN_FEATURE_ENCODER);
    /// fp8 e4m3 / e5m2 caches.
    pub const FP8_CACHE: Features = Features(sys::PAGEDATTN_FEATURE_FP8_CACHE);
    /// Log-sum-exp output.
    pub const LSE: Features = Features(sys::PAGEDATTN_FEATURE_LSE);
    /// [`Backend::merge_states`].
    pub const MERGE_STATES: Features = Features(sys::PAGEDATTN_FEATURE_MERGE_STATES);
    /// `query_len > 1` with `context_len > 0`.
    pub const CHUNKED_PREFILL: Features = Features(sys::PAGEDATTN_FEATURE_CHUNKED_PREFILL);
    /// Swaps between device and host caches.
    pub const HOST_SWAP: Features = Features(sys::PAGEDATTN_FEATURE_HOST_SWAP);
    /// Forwards capturable in a CUDA/HIP graph.
    pub const GRAPH_CAPTURE: Features = Features(sys::PAGEDATTN_FEATURE_GRAPH_CAPTURE);
    /// Caches over caller memory ([`KvCache::wrap`]).
    pub const WRAP_CACHE: Features = Features(sys::PAGEDATTN_FEATURE_WRAP_CACHE);
    /// Attention sinks ([`AttentionOptions::sinks`]).
    pub const SINKS: Features = Features(sys::PAGEDATTN_FEATURE_SINKS);
    /// Chunked local attention ([`AttentionOptions::attention_chunk`]).
    pub const CHUNKED_LOCAL: Features = Features(sys::PAGEDATTN_FEATURE_CHUNKED_LOCAL);
    /// Per-KV-head fp8 scales ([`AttentionOptions::k_head_scales`], [`KvCache::write_scaled`]).
    pub const HEAD_SCALES: Features = Features(sys::PAGEDATTN_FEATURE_HEAD_SCALES);
    /// Speculative-decoding tree masks ([`crate::BatchDesc::tree_mask`]).
    pub const TREE_MASK: Features = Features(sys::PAGEDATTN_FEATURE_TREE_MASK);
    /// Multi-head latent attention: latent caches ([`crate::CacheDesc::LATENT`]),
    /// [`KvCache::write_latent`] and [`Backend::forward_mla_with`].
    pub const MLA: Features = Features(sys::PAGEDATTN_FEATURE_MLA);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }
}

/// What a backend can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// "cpu", "onednn", "cuda", "hip".
    pub name: String,
    /// Where tensors and caches must live.
    pub device: Device,
    /// Supported features.
    pub features: Features,
    /// q/k/v/out dtypes, as a mask of [`DType::bit`].
    pub dtypes: u32,
    /// Cache dtypes, as a mask of [`DType::bit`].
    pub cache_dtypes: u32,
    /// Layouts: bit `1 << layout`.
    pub layouts: u32,
    /// Bit k set = block size 2^k supported.
    pub block_sizes: u32,
    /// Bit i set = head size 8*(i+1) supported.
    pub head_sizes: u32,
    /// CPU: worker threads in use; GPU: 0.
    pub max_num_threads: usize,
    /// Bytes of device memory (GPU), 0 if unknown or host.
    pub total_memory: u64,
    /// The code path the backend runs, which decides how results round: on CPU backends the
    /// SIMD target as `PAGEDATTN_CPU_TARGET` spells it ("AVX3_BF16", "AVX2"...), on GPU backends
    /// the device architecture ("sm_90", "gfx942").
    pub target: String,
    /// One line: what the backend chose when it was created and the value of every environment
    /// variable it read (e.g. "PAGEDATTN_CPU_SPIN_US=100").
    pub settings: String,
    /// Latent (MLA) caches: bit i set = row size 32*(i+1) supported; 0 without
    /// [`Features::MLA`].
    pub latent_sizes: u32,
}

impl Capabilities {
    /// Whether q/k/v/out may have this dtype.
    pub fn supports_dtype(&self, dtype: DType) -> bool {
        self.dtypes & dtype.bit() != 0
    }

    /// Whether a cache may have this dtype.
    pub fn supports_cache_dtype(&self, dtype: DType) -> bool {
        self.cache_dtypes & dtype.bit() != 0
    }

    /// Supported block sizes, ascending.
    pub fn block_size_list(&self) -> Vec<usize> {
        (0..32).filter(|k| self.block_sizes & (1 << k) != 0).map(|k| 1usize << k).collect()
    }

    /// Supported head sizes, ascending.
    pub fn head_size_list(&self) -> Vec<usize> {
        (0..32).filter(|i| self.head_sizes & (1 << i) != 0).map(|i| 8 * (i + 1)).collect()
    }

    /// Supported latent (MLA) row sizes, ascending.
    pub fn latent_size_list(&self) -> Vec<usize> {
        (0..32).filter(|i| self.latent_sizes & (1 << i) != 0).map(|i| 32 * (i + 1)).collect()
    }
}

/// What a backend holds ([`Backend::memory_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes of the caches the backend allocated (not those over caller memory), of batch
    /// metadata and of batch workspaces, on the device and in host memory: what `memory_limit`
    /// bounds.
    pub bytes_in_use: u64,
    /// The backend's [`BackendOptions::memory_limit`]; 0 = unlimited.
    pub memory_limit: u64,
    /// Caches created from the backend and not yet dropped.
    pub num_caches: usize,
    /// Batches created from the backend and not yet dropped.
    pub num_batches: usize,
}

/// A compute backend (`pagedattn_backend`): one device driven by one implementation.
///
/// A shared handle: clones are cheap and use the same C backend, and every [`KvCache`] and
/// [`Batch`] created from it holds a clone, so the backend lives until the last of them is
/// dropped. An engine can therefore own its backend, caches and batches side by side, or keep
/// only the caches ([`KvCache::backend`] gives the backend back).
#[derive(Clone, Debug)]
pub struct Backend {
    shared: Arc<OwnedBackend>,
}

/// The C handle, destroyed when the last [`Backend`] clone (and so the last cache and batch) is
/// gone.
#[derive(Debug)]
struct OwnedBackend {
    raw: NonNull<sys::pagedattn_backend>,
}

// SAFETY: backend.h: creating and destroying backends is thread-safe, and nothing ties a
// backend to the thread that created it. The handle is destroyed by the last owner's drop,
// when no other reference (and so no call on another thread) remains.
unsafe impl Send for OwnedBackend {}
// SAFETY: backend.h: "a backend handle may be used from many threads at once for calls on
// distinct batches, outputs and cache regions". Outputs are `&mut` here; cache regions are the
// caller's to keep apart, as in C (see KvCache's Sync); destroy happens in Drop only.
unsafe impl Sync for OwnedBackend {}

impl Drop for OwnedBackend {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once, by the last owner: every cache and batch holds
        // a clone of the `Arc`, so they are gone already.
        unsafe { sys::pagedattn_backend_destroy(self.raw.as_ptr()) }
    }
}

impl Backend {
    /// Creates a backend by name: "cpu", "onednn", "cuda", "hip" or "auto", with defaults.
    pub fn new(name: &str) -> Result<Backend> {
        Backend::create(name, None)
    }

    /// Creates a backend with options.
    pub fn with_options(name: &str, options: &BackendOptions) -> Result<Backend> {
        Backend::create(name, Some(options))
    }

    fn create(name: &str, options: Option<&BackendOptions>) -> Result<Backend> {
        let cname = CString::new(name)
            .map_err(|_| Error::binding(Status::InvalidArgument, "backend name contains NUL"))?;
        let raw_opts = options
            .map(|o| -> Result<_> {
                let mut raw = sys::pagedattn_backend_options::default();
                // SAFETY: valid pointer; fills defaults and struct_size.
                unsafe { sys::pagedattn_backend_options_init(&mut raw) };
                raw.device_index = to_c_i32("device_index", o.device_index)?;
                raw.num_threads = to_c_i32("num_threads", o.num_threads)?;
                raw.flags = o.flags;
                raw.memory_limit = o.memory_limit;
                Ok(raw)
            })
            .transpose()?;
        let mut out = ptr::null_mut();
        let opts_ptr = raw_opts.as_ref().map_or(ptr::null(), |o| o as *const _);
        // SAFETY: valid out pointer, NUL-terminated name, options NULL or initialised.
        check(unsafe { sys::pagedattn_backend_create(&mut out, cname.as_ptr(), opts_ptr) })?;
        NonNull::new(out)
            .map(|raw| Backend { shared: Arc::new(OwnedBackend { raw }) })
            .ok_or_else(|| Error::binding(Status::Internal, "backend_create returned OK and NULL"))
    }

    /// The raw handle, for calls through [`crate::sys`]; it stays owned by `self` (and its
    /// clones, caches and batches).
    pub fn as_ptr(&self) -> *mut sys::pagedattn_backend {
        self.shared.raw.as_ptr()
    }

    /// Whether `self` and `other` are clones of one backend.
    pub fn same_as(&self, other: &Backend) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// What this backend can do.
    pub fn capabilities(&self) -> Result<Capabilities> {
        let mut caps = sys::pagedattn_capabilities {
            struct_size: std::mem::size_of::<sys::pagedattn_capabilities>() as u32,
            ..Default::default()
        };
        // SAFETY: valid out struct and live handle.
        check(unsafe { sys::pagedattn_backend_get_capabilities(&mut caps, self.as_ptr()) })?;
        Ok(Capabilities {
            // SAFETY: static string owned by the library.
            name: unsafe { static_str(caps.name) }.to_string(),
            device: Device::from_raw(caps.device),
            features: Features(caps.features),
            dtypes: caps.dtypes,
            cache_dtypes: caps.cache_dtypes,
            layouts: caps.layouts,
            block_sizes: caps.block_sizes,
            head_sizes: caps.head_sizes,
            max_num_threads: from_c("max_num_threads", caps.max_num_threads)?,
            total_memory: caps.total_memory,
            // SAFETY: strings the backend owns until it is destroyed (or NULL, read as ""); `&self`
            // keeps it alive while they are copied.
            target: unsafe { owned_str(caps.target) },
            settings: unsafe { owned_str(caps.settings) },
            latent_sizes: caps.latent_sizes,
        })
    }

    /// The memory this backend holds now (`pagedattn_backend_get_memory_usage`): a snapshot
    /// when other threads allocate at the same time.
    pub fn memory_usage(&self) -> Result<MemoryUsage> {
        let mut raw = sys::pagedattn_memory_usage {
            struct_size: std::mem::size_of::<sys::pagedattn_memory_usage>() as u32,
            ..Default::default()
        };
        // SAFETY: valid out struct with its size set; live handle.
        check(unsafe { sys::pagedattn_backend_get_memory_usage(&mut raw, self.as_ptr()) })?;
        Ok(MemoryUsage {
            bytes_in_use: raw.bytes_in_use,
            memory_limit: raw.memory_limit,
            num_caches: from_c("num_caches", raw.num_caches)?,
            num_batches: from_c("num_batches", raw.num_batches)?,
        })
    }

    /// Waits for the work queued on `stream` and reports asynchronous device errors. Returns at
    /// once on CPU backends.
    pub fn synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: live handle; the stream's validity is the promise of Stream::from_raw.
        check(unsafe { sys::pagedattn_backend_synchronize(self.as_ptr(), stream.as_ptr()) })
    }

    /// Runs one layer of attention for a planned batch (`pagedattn_forward`), with the
    /// arguments in a [`ForwardArgs`] (see there for each). On error nothing is written.
    ///
    /// Threads may run forwards on one cache at once, each with its own batch and output, when
    /// the blocks they write (with `write_kv`) are disjoint from the blocks the others read or
    /// write: the C contract, which Rust cannot check (see the crate's "Threads").
    pub fn forward_with(&self, args: ForwardArgs<'_, '_, '_>) -> Result<()> {
        let ForwardArgs { batch, cache, layer, options, q, k, v, out, lse } = args;
        let layer = to_c_i32("layer", layer)?;
        let opts_raw = options.to_raw()?;
        let q_raw = q.as_raw();
        let k_raw = k.map(Tensor::as_raw);
        let v_raw = v.map(Tensor::as_raw);
        let mut out_raw = out.as_raw();
        let mut lse_raw = lse.map(|t| t.as_raw());
        let cache_ptr = cache.map_or(ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: live handles; descriptors point into borrowed tensors that outlive the call;
        // the library checks every shape against the batch before touching memory.
        check(unsafe {
            sys::pagedattn_forward(
                self.as_ptr(),
                batch.as_ptr(),
                cache_ptr,
                layer,
                &*opts_raw,
                &q_raw,
                k_raw.as_ref().map_or(ptr::null(), |t| t as *const _),
                v_raw.as_ref().map_or(ptr::null(), |t| t as *const _),
                &mut out_raw,
                lse_raw.as_mut().map_or(ptr::null_mut(), |t| t as *mut _),
                options.stream.as_ptr(),
            )
        })
    }

    /// [`Backend::forward_with`] with the arguments in `pagedattn_forward`'s order: `cache`
    /// `None` only for encoder-only attention, `k`/`v` `None` when not needed, `lse` optional.
    #[allow(clippy::too_many_arguments)] // mirrors pagedattn_forward's arguments
    pub fn forward(
        &self,
        batch: &Batch,
        cache: Option<&KvCache<'_>>,
        layer: usize,
        options: &AttentionOptions<'_>,
        q: &Tensor<'_>,
        k: Option<&Tensor<'_>>,
        v: Option<&Tensor<'_>>,
        out: &mut TensorMut<'_>,
        lse: Option<&mut TensorMut<'_>>,
    ) -> Result<()> {
        self.forward_with(ForwardArgs { batch, cache, layer, options, q, k, v, out, lse })
    }

    /// Multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi K2) in the absorbed form over a
    /// latent cache (`pagedattn_forward_mla`; [`Features::MLA`]), with the arguments in an
    /// [`MlaForwardArgs`]. Every query head reads each key's latent row of D values: the score
    /// is `scale * (q . row)` over all D, then soft cap, masks and softmax as decoder attention,
    /// and the output is the weights times the rows' leading R values. The forward writes
    /// nothing to the cache (write the step's rows with [`KvCache::write_latent`] first). A plain
    /// cache is refused ([`Status::InvalidArgument`]), as [`Backend::forward_with`] refuses a
    /// latent one; on error nothing is written.
    pub fn forward_mla_with(&self, args: MlaForwardArgs<'_, '_, '_>) -> Result<()> {
        let MlaForwardArgs { batch, cache, layer, options, q_nope, q_pe, out, lse } = args;
        let layer = to_c_i32("layer", layer)?;
        let opts_raw = options.to_raw()?;
        let q_nope_raw = q_nope.as_raw();
        let q_pe_raw = q_pe.map(Tensor::as_raw);
        let mut out_raw = out.as_raw();
        let mut lse_raw = lse.map(|t| t.as_raw());
        // SAFETY: as forward_with.
        check(unsafe {
            sys::pagedattn_forward_mla(
                self.as_ptr(),
                batch.as_ptr(),
                cache.as_ptr(),
                layer,
                &*opts_raw,
                &q_nope_raw,
                q_pe_raw.as_ref().map_or(ptr::null(), |t| t as *const _),
                &mut out_raw,
                lse_raw.as_mut().map_or(ptr::null_mut(), |t| t as *mut _),
                options.stream.as_ptr(),
            )
        })
    }

    /// [`Backend::forward_mla_with`] with the arguments in `pagedattn_forward_mla`'s order:
    /// `q_pe` `None` for whole query rows in `q_nope`, `lse` optional.
    #[allow(clippy::too_many_arguments)] // mirrors pagedattn_forward_mla's arguments
    pub fn forward_mla(
        &self,
        batch: &Batch,
        cache: &KvCache<'_>,
        layer: usize,
        options: &AttentionOptions<'_>,
        q_nope: &Tensor<'_>,
        q_pe: Option<&Tensor<'_>>,
        out: &mut TensorMut<'_>,
        lse: Option<&mut TensorMut<'_>>,
    ) -> Result<()> {
        self.forward_mla_with(MlaForwardArgs { batch, cache, layer, options, q_nope, q_pe, out, lse })
    }

    /// Merges two partial results over disjoint key sets into the exact one
    /// (`pagedattn_merge_states`) on the default stream. `o1`, `o2`, `out`: `[T, H, D]`;
    /// `lse1`, `lse2`, `lse_out`: float32 `[T, H]`. In-place merging (out = o1) needs the raw
    /// constructors, since a slice cannot be borrowed twice.
    pub fn merge_states(
        &self,
        out: &mut TensorMut<'_>,
        lse_out: Option<&mut TensorMut<'_>>,
        o1: &Tensor<'_>,
        lse1: &Tensor<'_>,
        o2: &Tensor<'_>,
        lse2: &Tensor<'_>,
    ) -> Result<()> {
        self.merge_states_on(Stream::DEFAULT, out, lse_out, o1, lse1, o2, lse2)
    }

    /// As [`Backend::merge_states`], queued on `stream`.
    #[allow(clippy::too_many_arguments)] // mirrors pagedattn_merge_states's arguments
    pub fn merge_states_on(
        &self,
        stream: Stream,
        out: &mut TensorMut<'_>,
        lse_out: Option<&mut TensorMut<'_>>,
        o1: &Tensor<'_>,
        lse1: &Tensor<'_>,
        o2: &Tensor<'_>,
        lse2: &Tensor<'_>,
    ) -> Result<()> {
        let mut out_raw = out.as_raw();
        let mut lse_out_raw = lse_out.map(|t| t.as_raw());
        let (o1_raw, lse1_raw, o2_raw, lse2_raw) = (o1.as_raw(), lse1.as_raw(), o2.as_raw(), lse2.as_raw());
        // SAFETY: as forward; the library checks shapes before touching memory.
        check(unsafe {
            sys::pagedattn_merge_states(
                self.as_ptr(),
                &mut out_raw,
                lse_out_raw.as_mut().map_or(ptr::null_mut(), |t| t as *mut _),
                &o1_raw,
                &lse1_raw,
                &o2_raw,
                &lse2_raw,
                stream.as_ptr(),
            )
        })
    }
}
