//! The paged KV cache.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use crate::backend::Backend;
use crate::tensor::{check_element, Device, Element, Stream, Tensor};
use crate::{check, from_c, sys, to_c_i32, to_c_i64, DType, Error, Result, Status};

/// Order of a block's elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[block][slot][head][dim]` (FlashAttention's).
    #[default]
    Nhd,
    /// `[block][head][slot][dim]` (per-head streaming).
    Hnd,
}

impl Layout {
    /// The C `pagedattn_layout` value.
    pub fn raw(self) -> sys::pagedattn_layout {
        match self {
            Layout::Nhd => sys::PAGEDATTN_LAYOUT_NHD,
            Layout::Hnd => sys::PAGEDATTN_LAYOUT_HND,
        }
    }
}

/// Geometry of a cache (`pagedattn_kv_cache_desc`). `Default` matches
/// `pagedattn_kv_cache_desc_init`: zero sizes, NHD, bfloat16, no flags. The sizes are checked
/// to fit C's int32 when the description is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheDesc {
    /// Layers (>= 1).
    pub num_layers: usize,
    /// Blocks (>= 1).
    pub num_blocks: usize,
    /// Tokens per block: a power of two the backend supports.
    pub block_size: usize,
    /// KV heads (>= 1).
    pub num_kv_heads: usize,
    /// Head size.
    pub head_size: usize,
    /// Element type: the model's, or fp8.
    pub dtype: DType,
    /// Block layout.
    pub layout: Layout,
    /// `PAGEDATTN_KV_CACHE_*` flags: [`CacheDesc::HOST`], [`CacheDesc::LATENT`].
    pub flags: u32,
}

impl Default for CacheDesc {
    fn default() -> Self {
        CacheDesc {
            num_layers: 0,
            num_blocks: 0,
            block_size: 0,
            num_kv_heads: 0,
            head_size: 0,
            dtype: DType::BF16,
            layout: Layout::Nhd,
            flags: 0,
        }
    }
}

impl CacheDesc {
    /// Flag: place the cache in (pinned) host memory owned by the backend, for swaps.
    pub const HOST: u32 = sys::PAGEDATTN_KV_CACHE_HOST;
    /// Flag: a latent cache for multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi K2;
    /// [`crate::Features::MLA`]). Each token stores one row of `head_size` values per layer
    /// (`kv_lora_rank` values, then the rotary key: 576 = 512 + 64 for DeepSeek V3) shared by
    /// every query head; `num_kv_heads` must be 1. Written by [`KvCache::write_latent`], read by
    /// [`crate::Backend::forward_mla_with`].
    pub const LATENT: u32 = sys::PAGEDATTN_KV_CACHE_LATENT;

    /// Whether [`CacheDesc::LATENT`] is set.
    pub fn is_latent(&self) -> bool {
        self.flags & CacheDesc::LATENT != 0
    }

    pub(crate) fn to_raw(self) -> Result<sys::pagedattn_kv_cache_desc> {
        let mut raw = sys::pagedattn_kv_cache_desc::default();
        // SAFETY: valid pointer; sets struct_size.
        unsafe { sys::pagedattn_kv_cache_desc_init(&mut raw) };
        raw.num_layers = to_c_i32("num_layers", self.num_layers)?;
        raw.num_blocks = to_c_i32("num_blocks", self.num_blocks)?;
        raw.block_size = to_c_i32("block_size", self.block_size)?;
        raw.num_kv_heads = to_c_i32("num_kv_heads", self.num_kv_heads)?;
        raw.head_size = to_c_i32("head_size", self.head_size)?;
        raw.dtype = self.dtype.raw();
        raw.layout = self.layout.raw();
        raw.flags = self.flags;
        Ok(raw)
    }

    /// Bytes one block takes across all layers, K and V (a latent cache's rows once); also one
    /// block's record in [`KvCache::read_blocks`] buffers.
    pub fn bytes_per_block(&self) -> Result<u64> {
        let raw = self.to_raw()?;
        let mut out = 0u64;
        // SAFETY: valid pointers.
        check(unsafe { sys::pagedattn_kv_cache_bytes_per_block(&mut out, &raw) })?;
        Ok(out)
    }

    /// Compact element strides (block, slot, head) of the layout; an [`Status::Overflow`] error
    /// when a block's size overflows `usize`.
    pub fn compact_strides(&self) -> Result<[usize; 3]> {
        let (bs, h, d) = (self.block_size, self.num_kv_heads, self.head_size);
        let overflow = || Error::binding(Status::Overflow, format!("block of {bs} x {h} x {d} elements"));
        let hd = h.checked_mul(d).ok_or_else(overflow)?;
        let block = hd.checked_mul(bs).ok_or_else(overflow)?;
        Ok(match self.layout {
            Layout::Nhd => [block, hd, d],
            Layout::Hnd => [block, d, bs.checked_mul(d).ok_or_else(overflow)?],
        })
    }

    /// Elements one layer's K (or V) reaches with these strides, or None on overflow/bad input.
    fn layer_extent(&self, strides: [usize; 3]) -> Option<usize> {
        let dims = [self.num_blocks, self.block_size, self.num_kv_heads];
        let mut last = self.head_size.checked_sub(1)?;
        for (n, s) in dims.into_iter().zip(strides) {
            last = last.checked_add(n.checked_sub(1)?.checked_mul(s)?)?;
        }
        last.checked_add(1)
    }
}

/// Layer memory of a cache ([`KvCache::layer_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerMemory {
    /// Base of the layer's K blocks.
    pub k: *mut c_void,
    /// Base of the layer's V blocks.
    pub v: *mut c_void,
    /// Element strides: block, slot, head.
    pub strides: [usize; 3],
}

/// A paged KV cache (`pagedattn_kv_cache`), owning its memory or wrapping the caller's.
///
/// It holds a clone of its [`Backend`], which therefore lives at least as long. `'a` is the
/// borrow of the caller's memory in a wrapped cache; a cache that owns its memory
/// ([`KvCache::new`]) is a `KvCache<'static>`, which an engine struct can own and which can
/// move to other threads.
///
/// Shared across threads like the C handle: forwards and the writing calls (`write`,
/// `copy_blocks`, `swap_blocks_from`, `load_blocks`) take `&self`, so threads can use one cache
/// at once. kv_cache.h lets such calls run concurrently only on disjoint blocks or slots; keeping
/// them apart is the caller's job, as in C (see the crate's "Threads").
#[derive(Debug)]
pub struct KvCache<'a> {
    raw: NonNull<sys::pagedattn_kv_cache>,
    backend: Backend,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: kv_cache.h ties no cache to a thread; destroy needs ownership (Drop) here.
unsafe impl Send for KvCache<'_> {}
// SAFETY: kv_cache.h: calls writing a cache may run concurrently with each other and with
// forwards on disjoint blocks/slots, reads of a block concurrently with each other, and
// get_desc/get_layer always. Destroy, the one call needing exclusive access, takes ownership.
// The memory behind the handle holds only K/V numbers, never addresses or sizes the library
// trusts, and no Rust reference to it exists while the cache lives (owned: library memory;
// wrapped: borrowed `&mut` for 'a). So calls that break the disjointness rule garble the values
// of the slots they share and nothing else.
unsafe impl Sync for KvCache<'_> {}

fn pairs_ptr(pairs: &[[i32; 2]]) -> *const i32 {
    if pairs.is_empty() { ptr::null() } else { pairs.as_ptr() as *const i32 }
}

impl KvCache<'static> {
    /// Creates a cache whose memory the library allocates on the backend's device (zeroed).
    /// The cache keeps a clone of `backend`.
    pub fn new(backend: &Backend, desc: &CacheDesc) -> Result<Self> {
        let raw = desc.to_raw()?;
        let mut out = ptr::null_mut();
        // SAFETY: valid pointers and a live backend.
        check(unsafe { sys::pagedattn_kv_cache_create(&mut out, backend.as_ptr(), &raw) })?;
        KvCache::from_out(out, backend)
    }
}

impl<'a> KvCache<'a> {
    fn from_out(out: *mut sys::pagedattn_kv_cache, backend: &Backend) -> Result<Self> {
        NonNull::new(out)
            .map(|raw| KvCache { raw, backend: backend.clone(), _borrow: PhantomData })
            .ok_or_else(|| Error::binding(Status::Internal, "cache call returned OK and NULL"))
    }

    /// Creates a cache over host slices, used in place: one slice per layer for K and for V (a
    /// latent cache, [`CacheDesc::LATENT`]: its rows in `k_layers` and `v_layers` empty).
    /// `strides` are element strides (block, slot, head); `None` = compact for the layout. Each
    /// slice must hold every element the strides reach; `T` must hold `desc.dtype` (`f32`,
    /// `half::f16`, `half::bf16`, `u16` for float16/bfloat16, `u8` for fp8). The slices stay
    /// borrowed while the cache lives; the cache keeps a clone of `backend`.
    pub fn wrap<T: Element>(
        backend: &Backend,
        desc: &CacheDesc,
        k_layers: Vec<&'a mut [T]>,
        v_layers: Vec<&'a mut [T]>,
        strides: Option<[usize; 3]>,
    ) -> Result<Self> {
        check_element::<T>(desc.dtype)?;
        let no_v = desc.is_latent() && v_layers.is_empty();
        if k_layers.len() != desc.num_layers || (v_layers.len() != desc.num_layers && !no_v) {
            return Err(Error::binding(
                Status::InvalidArgument,
                format!("{} K and {} V layer slices for num_layers {}", k_layers.len(), v_layers.len(), desc.num_layers),
            ));
        }
        let s = match strides {
            Some(s) => s,
            None => desc.compact_strides()?,
        };
        let need = desc.layer_extent(s).ok_or_else(|| {
            Error::binding(Status::InvalidArgument, format!("cache geometry {desc:?} with strides {s:?}"))
        })?;
        if let Some(short) = k_layers.iter().chain(&v_layers).find(|l| l.len() < need) {
            return Err(Error::binding(
                Status::InvalidArgument,
                format!("layer slice of {} elements, the geometry needs {need}", short.len()),
            ));
        }
        let k: Vec<*mut c_void> = k_layers.into_iter().map(|l| l.as_mut_ptr() as *mut c_void).collect();
        let v: Vec<*mut c_void> = v_layers.into_iter().map(|l| l.as_mut_ptr() as *mut c_void).collect();
        // SAFETY: the pointers come from slices borrowed mutably for 'a, large enough for the
        // geometry (checked above).
        unsafe { KvCache::wrap_raw(backend, desc, &k, &v, strides.unwrap_or([0; 3]), Device::CPU) }
    }

    /// Creates a cache over arbitrary memory (e.g. a framework's GPU tensors). A latent cache
    /// may pass no V pointers.
    ///
    /// # Safety
    /// Each pointer must address memory on `device` holding every element the geometry and
    /// `strides` reach (`[0; 3]` = compact), valid and not otherwise accessed for `'a`, from
    /// any thread the cache is used on.
    pub unsafe fn wrap_raw(
        backend: &Backend,
        desc: &CacheDesc,
        k_layers: &[*mut c_void],
        v_layers: &[*mut c_void],
        strides: [usize; 3],
        device: Device,
    ) -> Result<Self> {
        let no_v = desc.is_latent() && v_layers.is_empty();
        if (k_layers.len() != v_layers.len() && !no_v) || k_layers.len() != desc.num_layers {
            return Err(Error::binding(
                Status::InvalidArgument,
                format!("{} K and {} V layer pointers for num_layers {}", k_layers.len(), v_layers.len(), desc.num_layers),
            ));
        }
        let raw = desc.to_raw()?;
        let mem = sys::pagedattn_kv_cache_memory {
            struct_size: std::mem::size_of::<sys::pagedattn_kv_cache_memory>() as u32,
            k_layers: k_layers.as_ptr(),
            v_layers: if no_v { ptr::null() } else { v_layers.as_ptr() },
            block_stride: to_c_i64("block_stride", strides[0])?,
            slot_stride: to_c_i64("slot_stride", strides[1])?,
            head_stride: to_c_i64("head_stride", strides[2])?,
            device: device.raw(),
        };
        let mut out = ptr::null_mut();
        check(sys::pagedattn_kv_cache_wrap(&mut out, backend.as_ptr(), &raw, &mem))?;
        KvCache::from_out(out, backend)
    }

    /// The raw handle, for calls through [`crate::sys`]; it stays owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::pagedattn_kv_cache {
        self.raw.as_ptr()
    }

    /// The backend the cache was created on (a clone that the cache keeps alive).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The cache's geometry.
    pub fn desc(&self) -> Result<CacheDesc> {
        let mut raw = sys::pagedattn_kv_cache_desc {
            struct_size: std::mem::size_of::<sys::pagedattn_kv_cache_desc>() as u32,
            ..Default::default()
        };
        // SAFETY: valid out struct; live handle.
        check(unsafe { sys::pagedattn_kv_cache_get_desc(&mut raw, self.raw.as_ptr()) })?;
        let dtype = DType::from_raw(raw.dtype)
            .ok_or_else(|| Error::binding(Status::Internal, format!("unknown cache dtype {}", raw.dtype)))?;
        Ok(CacheDesc {
            num_layers: from_c("num_layers", raw.num_layers)?,
            num_blocks: from_c("num_blocks", raw.num_blocks)?,
            block_size: from_c("block_size", raw.block_size)?,
            num_kv_heads: from_c("num_kv_heads", raw.num_kv_heads)?,
            head_size: from_c("head_size", raw.head_size)?,
            dtype,
            layout: if raw.layout == sys::PAGEDATTN_LAYOUT_HND { Layout::Hnd } else { Layout::Nhd },
            flags: raw.flags,
        })
    }

    /// Layer `layer`'s K and V base pointers and element strides, to hand to other code.
    pub fn layer_memory(&self, layer: usize) -> Result<LayerMemory> {
        let layer = to_c_i32("layer", layer)?;
        let (mut k, mut v, mut strides) = (ptr::null_mut(), ptr::null_mut(), [0i64; 3]);
        // SAFETY: valid out pointers; live handle.
        check(unsafe { sys::pagedattn_kv_cache_get_layer(&mut k, &mut v, strides.as_mut_ptr(), self.raw.as_ptr(), layer) })?;
        let [b, sl, h] = strides;
        Ok(LayerMemory { k, v, strides: [from_c("block_stride", b)?, from_c("slot_stride", sl)?, from_c("head_stride", h)?] })
    }

    /// Reshape-and-cache: stores `key[t]`, `value[t]` (`[T, Hkv, D]`) at `slot_mapping[t]` (a
    /// 1-D int32/int64 tensor; -1 = padding) of `layer`. Scales apply to fp8 caches only. A host
    /// slot mapping is checked entirely before anything is written. Threads may write one cache
    /// at once when their slots are disjoint (and no forward reads them).
    pub fn write(
        &self,
        layer: usize,
        key: &Tensor<'_>,
        value: &Tensor<'_>,
        slot_mapping: &Tensor<'_>,
        k_scale: f32,
        v_scale: f32,
    ) -> Result<()> {
        self.write_on(Stream::DEFAULT, layer, key, value, slot_mapping, k_scale, v_scale)
    }

    /// As [`KvCache::write`], queued on `stream`.
    #[allow(clippy::too_many_arguments)] // mirrors pagedattn_kv_cache_write's arguments
    pub fn write_on(
        &self,
        stream: Stream,
        layer: usize,
        key: &Tensor<'_>,
        value: &Tensor<'_>,
        slot_mapping: &Tensor<'_>,
        k_scale: f32,
        v_scale: f32,
    ) -> Result<()> {
        let layer = to_c_i32("layer", layer)?;
        let (k, v, s) = (key.as_raw(), value.as_raw(), slot_mapping.as_raw());
        // SAFETY: descriptors of borrowed tensors; the library validates shapes and slots.
        check(unsafe {
            sys::pagedattn_kv_cache_write(self.raw.as_ptr(), layer, &k, &v, &s, k_scale, v_scale, stream.as_ptr())
        })
    }

    /// [`KvCache::write`] with per-KV-head scales (fp8 checkpoints quantised per head,
    /// `pagedattn_kv_cache_write_scaled`): on an fp8 cache head h of `key[t]` is stored as
    /// `fp8(key[t][h] / k_head_scales[h])`, and likewise for values; other caches ignore the
    /// scales. Each is a float32 `[num_kv_heads]` tensor on the cache's device, or `None` for
    /// scale 1. A scale in host memory that is not finite and > 0 is refused
    /// ([`Status::InvalidArgument`]) before anything is written.
    pub fn write_scaled(
        &self,
        layer: usize,
        key: &Tensor<'_>,
        value: &Tensor<'_>,
        slot_mapping: &Tensor<'_>,
        k_head_scales: Option<&Tensor<'_>>,
        v_head_scales: Option<&Tensor<'_>>,
    ) -> Result<()> {
        self.write_scaled_on(Stream::DEFAULT, layer, key, value, slot_mapping, k_head_scales, v_head_scales)
    }

    /// As [`KvCache::write_scaled`], queued on `stream`.
    #[allow(clippy::too_many_arguments)] // mirrors pagedattn_kv_cache_write_scaled's arguments
    pub fn write_scaled_on(
        &self,
        stream: Stream,
        layer: usize,
        key: &Tensor<'_>,
        value: &Tensor<'_>,
        slot_mapping: &Tensor<'_>,
        k_head_scales: Option<&Tensor<'_>>,
        v_head_scales: Option<&Tensor<'_>>,
    ) -> Result<()> {
        let layer = to_c_i32("layer", layer)?;
        let (k, v, s) = (key.as_raw(), value.as_raw(), slot_mapping.as_raw());
        let (ks, vs) = (k_head_scales.map(Tensor::as_raw), v_head_scales.map(Tensor::as_raw));
        let at = |t: &Option<sys::pagedattn_tensor>| t.as_ref().map_or(ptr::null(), |t| t as *const _);
        // SAFETY: descriptors of borrowed tensors; the library validates shapes, slots and scales.
        check(unsafe {
            sys::pagedattn_kv_cache_write_scaled(self.raw.as_ptr(), layer, &k, &v, &s, at(&ks), at(&vs), stream.as_ptr())
        })
    }

    /// Reshape-and-cache for a latent (MLA) cache (`pagedattn_kv_cache_write_latent`, vLLM's
    /// `concat_and_cache_mla`): stores the row `[kv_c[t], k_pe[t]]` at `slot_mapping[t]` (-1 =
    /// padding) of `layer`. `kv_c` is `[T, R]` (the `kv_lora_rank` values) and `k_pe`
    /// `[T, D - R]` (the rotary key), each 2-D or 3-D with a middle extent of 1; or `k_pe` is
    /// `None` and `kv_c` holds whole rows, `[T, D]`. An fp8 cache stores `fp8(x / scale)`; other
    /// caches ignore `scale`. A plain cache is refused ([`Status::InvalidArgument`]), as
    /// [`KvCache::write`] refuses a latent one; nothing is written on error.
    pub fn write_latent(
        &self,
        layer: usize,
        kv_c: &Tensor<'_>,
        k_pe: Option<&Tensor<'_>>,
        slot_mapping: &Tensor<'_>,
        scale: f32,
    ) -> Result<()> {
        self.write_latent_on(Stream::DEFAULT, layer, kv_c, k_pe, slot_mapping, scale)
    }

    /// As [`KvCache::write_latent`], queued on `stream`.
    pub fn write_latent_on(
        &self,
        stream: Stream,
        layer: usize,
        kv_c: &Tensor<'_>,
        k_pe: Option<&Tensor<'_>>,
        slot_mapping: &Tensor<'_>,
        scale: f32,
    ) -> Result<()> {
        let layer = to_c_i32("layer", layer)?;
        let (c, s) = (kv_c.as_raw(), slot_mapping.as_raw());
        let pe = k_pe.map(Tensor::as_raw);
        let pe_ptr = pe.as_ref().map_or(ptr::null(), |t| t as *const _);
        // SAFETY: descriptors of borrowed tensors; the library validates shapes and slots.
        check(unsafe {
            sys::pagedattn_kv_cache_write_latent(self.raw.as_ptr(), layer, &c, pe_ptr, &s, scale, stream.as_ptr())
        })
    }

    /// Copies whole blocks (K and V, every layer) within the cache: `[src, dst]` pairs.
    pub fn copy_blocks(&self, pairs: &[[i32; 2]]) -> Result<()> {
        self.copy_blocks_on(Stream::DEFAULT, pairs)
    }

    /// As [`KvCache::copy_blocks`], queued on `stream`.
    pub fn copy_blocks_on(&self, stream: Stream, pairs: &[[i32; 2]]) -> Result<()> {
        // SAFETY: `[i32; 2]` slices are contiguous int32 pairs; live handle.
        check(unsafe { sys::pagedattn_kv_cache_copy_blocks(self.raw.as_ptr(), pairs_ptr(pairs), pairs.len(), stream.as_ptr()) })
    }

    /// Copies whole blocks from `src` into this cache: block `pair[0]` of `src` to block
    /// `pair[1]` of `self`. Geometries must match (layouts and block counts may differ); `src`
    /// may be `self`.
    pub fn swap_blocks_from(&self, src: &KvCache<'_>, pairs: &[[i32; 2]]) -> Result<()> {
        self.swap_blocks_from_on(Stream::DEFAULT, src, pairs)
    }

    /// As [`KvCache::swap_blocks_from`], queued on `stream`.
    pub fn swap_blocks_from_on(&self, stream: Stream, src: &KvCache<'_>, pairs: &[[i32; 2]]) -> Result<()> {
        // SAFETY: as copy_blocks; the library accepts src == dst.
        check(unsafe {
            sys::pagedattn_kv_cache_swap_blocks(self.raw.as_ptr(), src.raw.as_ptr(), pairs_ptr(pairs), pairs.len(), stream.as_ptr())
        })
    }

    /// Exports blocks into `buffer`: for each id, for each layer, the K block then the V block,
    /// packed in the cache's layout. `buffer` must hold `ids.len() * bytes_per_block` bytes.
    /// Synchronous: returns once the data is in `buffer`.
    pub fn read_blocks<T: Element>(&self, ids: &[i32], buffer: &mut [T]) -> Result<()> {
        self.read_blocks_on(Stream::DEFAULT, ids, buffer)
    }

    /// As [`KvCache::read_blocks`], with the copies queued on `stream` after its earlier work
    /// (GPU backends); still returns only once the data is in `buffer`.
    pub fn read_blocks_on<T: Element>(&self, stream: Stream, ids: &[i32], buffer: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(buffer);
        // SAFETY: the library writes at most `bytes` bytes into the buffer and has finished with
        // it when the call returns (read_blocks is synchronous).
        check(unsafe {
            sys::pagedattn_kv_cache_read_blocks(self.raw.as_ptr(), ids.as_ptr(), ids.len(),
                buffer.as_mut_ptr() as *mut c_void, bytes, stream.as_ptr())
        })
    }

    /// Exports blocks as bytes (see [`KvCache::read_blocks`]).
    pub fn read_blocks_to_vec(&self, ids: &[i32]) -> Result<Vec<u8>> {
        self.read_blocks_to_vec_on(Stream::DEFAULT, ids)
    }

    /// As [`KvCache::read_blocks_to_vec`], queued on `stream` (see [`KvCache::read_blocks_on`]).
    pub fn read_blocks_to_vec_on(&self, stream: Stream, ids: &[i32]) -> Result<Vec<u8>> {
        let per_block = self.desc()?.bytes_per_block()?;
        let len = usize::try_from(per_block)
            .ok()
            .and_then(|b| b.checked_mul(ids.len()))
            .ok_or_else(|| Error::binding(Status::Overflow, "export size overflows"))?;
        let mut buf = vec![0u8; len];
        self.read_blocks_on(stream, ids, &mut buf)?;
        Ok(buf)
    }

    /// Loads blocks from a buffer in [`KvCache::read_blocks`]' format (ids unique).
    /// Synchronous: `buffer` is no longer read when the call returns.
    pub fn load_blocks<T: Element>(&self, ids: &[i32], buffer: &[T]) -> Result<()> {
        self.load_blocks_on(Stream::DEFAULT, ids, buffer)
    }

    /// As [`KvCache::load_blocks`], with the copies queued on `stream` after its earlier work
    /// (GPU backends); still returns only once they are done.
    pub fn load_blocks_on<T: Element>(&self, stream: Stream, ids: &[i32], buffer: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(buffer);
        // SAFETY: the library reads at most `bytes` bytes, and not after returning.
        check(unsafe {
            sys::pagedattn_kv_cache_load_blocks(self.raw.as_ptr(), ids.as_ptr(), ids.len(),
                buffer.as_ptr() as *const c_void, bytes, stream.as_ptr())
        })
    }
}

impl Drop for KvCache<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once, while `self.backend` (dropped after this) still
        // holds the backend.
        unsafe { sys::pagedattn_kv_cache_destroy(self.raw.as_ptr()) }
    }
}
