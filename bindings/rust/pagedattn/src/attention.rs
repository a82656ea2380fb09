//! Per-call attention options and the arguments of a forward.

use std::ptr;

use crate::batch::Batch;
use crate::cache::KvCache;
use crate::tensor::{Stream, Tensor, TensorMut};
use crate::{sys, to_c_i32, Result};

/// Which attention a forward computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionType {
    /// Causal self-attention over the paged cache.
    #[default]
    Decoder,
    /// Bidirectional self-attention among each sequence's own tokens (context_len 0); with
    /// `write_kv` the k/v are also stored in the cache.
    Encoder,
    /// As `Encoder`, without a cache (`write_kv` must be false).
    EncoderOnly,
    /// Decoder queries over the encoder's K/V in the cross cache.
    Cross,
}

impl AttentionType {
    /// The C `pagedattn_attention_type` value.
    pub fn raw(self) -> sys::pagedattn_attention_type {
        match self {
            AttentionType::Decoder => sys::PAGEDATTN_ATTENTION_DECODER,
            AttentionType::Encoder => sys::PAGEDATTN_ATTENTION_ENCODER,
            AttentionType::EncoderOnly => sys::PAGEDATTN_ATTENTION_ENCODER_ONLY,
            AttentionType::Cross => sys::PAGEDATTN_ATTENTION_CROSS,
        }
    }
}

/// Options of one forward (`pagedattn_attention_options`, plus the stream). `Default` matches
/// `pagedattn_attention_options_init_sized`: scale 1/sqrt(D), no soft cap, no window, decoder,
/// write_kv, k/v scales 1, no ALiBi, no sinks, no attention chunk, no per-head scales, default
/// stream. `Send + Sync`: one value may serve the forwards of many threads.
#[derive(Clone, Debug)]
pub struct AttentionOptions<'a> {
    /// H: query heads.
    pub num_heads: usize,
    /// Hkv: KV heads (H % Hkv == 0).
    pub num_kv_heads: usize,
    /// D: head size (must equal the cache's).
    pub head_size: usize,
    /// Score scale; 0 = 1/sqrt(head_size).
    pub scale: f32,
    /// > 0 enables s = cap * tanh(s / cap); 0 = off.
    pub soft_cap: f32,
    /// W > 0: only keys with p - key_pos < W; 0 = off (decoder only).
    pub sliding_window: usize,
    /// Which attention.
    pub attention_type: AttentionType,
    /// Write the step's k/v into the cache first.
    pub write_kv: bool,
    /// fp8 caches: K dequantisation scale (> 0, finite).
    pub k_scale: f32,
    /// fp8 caches: V dequantisation scale.
    pub v_scale: f32,
    /// Optional ALiBi slopes: float32 `[num_heads]` on the backend's device (decoder only).
    pub alibi_slopes: Option<&'a Tensor<'a>>,
    /// Reserved, must be 0.
    pub flags: u32,
    /// Optional attention sinks (gpt-oss): float32 `[num_heads]` on the backend's device.
    /// `sinks[h]` is a logit that joins the softmax of every row of head h without a value; the
    /// row's lse includes it. Any attention type ([`crate::Features::SINKS`]).
    pub sinks: Option<&'a Tensor<'a>>,
    /// Chunked local attention (Llama 4), decoder only: C > 0 lets the token at position p see
    /// only keys k <= p with k / C == p / C; 0 = off ([`crate::Features::CHUNKED_LOCAL`]).
    pub attention_chunk: usize,
    /// Optional per-KV-head K scales: float32 `[num_kv_heads]` on the backend's device, used
    /// instead of `k_scale` by fp8 caches (head h loads `float(fp8) * scales[h]`, a write with
    /// `write_kv` stores `fp8(x / scales[h])`); other caches ignore them
    /// ([`crate::Features::HEAD_SCALES`]).
    pub k_head_scales: Option<&'a Tensor<'a>>,
    /// Optional per-KV-head V scales, as `k_head_scales`.
    pub v_head_scales: Option<&'a Tensor<'a>>,
    /// Stream the work is queued on (ignored on CPU).
    pub stream: Stream,
}

impl Default for AttentionOptions<'_> {
    fn default() -> Self {
        AttentionOptions {
            num_heads: 0,
            num_kv_heads: 0,
            head_size: 0,
            scale: 0.0,
            soft_cap: 0.0,
            sliding_window: 0,
            attention_type: AttentionType::Decoder,
            write_kv: true,
            k_scale: 1.0,
            v_scale: 1.0,
            alibi_slopes: None,
            flags: 0,
            sinks: None,
            attention_chunk: 0,
            k_head_scales: None,
            v_head_scales: None,
            stream: Stream::DEFAULT,
        }
    }
}

impl<'a> AttentionOptions<'a> {
    /// Defaults with the given shape.
    pub fn new(num_heads: usize, num_kv_heads: usize, head_size: usize) -> Self {
        AttentionOptions { num_heads, num_kv_heads, head_size, ..Default::default() }
    }

    /// Defaults for [`crate::Backend::forward_mla_with`]: `num_heads` query heads over latent
    /// rows of `head_size` (D, the cache's: 576 for DeepSeek V3), one KV head, decoder, no
    /// `write_kv` (MLA forwards never write the cache).
    pub fn mla(num_heads: usize, head_size: usize) -> Self {
        AttentionOptions { num_heads, num_kv_heads: 1, head_size, write_kv: false, ..Default::default() }
    }

    /// The C struct, holding the tensor descriptors it points to; an
    /// [`crate::Status::Overflow`] error when a size does not fit int32.
    pub(crate) fn to_raw(&self) -> Result<RawOptions> {
        let mut raw = sys::pagedattn_attention_options::default();
        // SAFETY: valid pointer and its size; fills defaults and struct_size, the fields since
        // 0.2 included.
        unsafe {
            sys::pagedattn_attention_options_init_sized(&mut raw, std::mem::size_of::<sys::pagedattn_attention_options>() as u32)
        };
        raw.num_heads = to_c_i32("num_heads", self.num_heads)?;
        raw.num_kv_heads = to_c_i32("num_kv_heads", self.num_kv_heads)?;
        raw.head_size = to_c_i32("head_size", self.head_size)?;
        raw.scale = self.scale;
        raw.soft_cap = self.soft_cap;
        raw.sliding_window = to_c_i32("sliding_window", self.sliding_window)?;
        raw.attention_type = self.attention_type.raw();
        raw.write_kv = i32::from(self.write_kv);
        raw.k_scale = self.k_scale;
        raw.v_scale = self.v_scale;
        raw.flags = self.flags;
        raw.attention_chunk = to_c_i32("attention_chunk", self.attention_chunk)?;
        let tensors = [self.alibi_slopes, self.sinks, self.k_head_scales, self.v_head_scales].map(|t| t.map(Tensor::as_raw));
        let mut boxed = Box::new(RawOptionsInner { opts: raw, tensors });
        let at = |t: &Option<sys::pagedattn_tensor>| t.as_ref().map_or(ptr::null(), |t| t as *const _);
        boxed.opts.alibi_slopes = at(&boxed.tensors[0]);
        boxed.opts.sinks = at(&boxed.tensors[1]);
        boxed.opts.k_head_scales = at(&boxed.tensors[2]);
        boxed.opts.v_head_scales = at(&boxed.tensors[3]);
        Ok(RawOptions(boxed))
    }
}

pub(crate) struct RawOptionsInner {
    opts: sys::pagedattn_attention_options,
    /// ALiBi slopes, sinks, K and V head scales.
    tensors: [Option<sys::pagedattn_tensor>; 4],
}

/// C options plus the tensor descriptors they point to, pinned in a box.
pub(crate) struct RawOptions(Box<RawOptionsInner>);

impl std::ops::Deref for RawOptions {
    type Target = sys::pagedattn_attention_options;
    fn deref(&self) -> &sys::pagedattn_attention_options {
        &self.0.opts
    }
}

/// The arguments of one [`Backend::forward_with`](crate::Backend::forward_with): what
/// `pagedattn_forward` takes, by name.
///
/// [`ForwardArgs::new`] takes the four that are always needed and leaves the rest empty (no
/// cache, layer 0, no k/v, no lse); the setters fill them in:
///
/// ```no_run
/// # use pagedattn::{AttentionOptions, Backend, Batch, ForwardArgs, KvCache, Tensor, TensorMut};
/// # fn step(backend: &Backend, batch: &Batch, cache: &KvCache<'_>, q: &Tensor<'_>, k: &Tensor<'_>,
/// #         v: &Tensor<'_>, out: &mut TensorMut<'_>) -> Result<(), pagedattn::Error> {
/// let opts = AttentionOptions::new(8, 2, 64);
/// for layer in 0..4 {
///     backend.forward_with(ForwardArgs::new(batch, &opts, q, out).cache(cache).layer(layer).kv(k, v))?;
/// }
/// # Ok(()) }
/// ```
///
/// The fields are public, so a struct literal names every argument instead. Lifetimes: `'a`
/// borrows everything (and bounds the input tensors' data), `'o` and `'l` are the data of `out`
/// and `lse`, kept apart because a `&mut` pins its referent's lifetime exactly.
#[derive(Debug)]
pub struct ForwardArgs<'a, 'o, 'l> {
    /// The planned step.
    pub batch: &'a Batch,
    /// The self-attention cache (decoder, encoder) or the cross cache (cross); `None` only for
    /// encoder-only attention.
    pub cache: Option<&'a KvCache<'a>>,
    /// Layer of the cache.
    pub layer: usize,
    /// Shape and options; also the stream the work is queued on.
    pub options: &'a AttentionOptions<'a>,
    /// Queries, `[num_tokens, H, D]`.
    pub q: &'a Tensor<'a>,
    /// Keys, `[rows, Hkv, D]`: needed with `options.write_kv` and for encoder types.
    pub k: Option<&'a Tensor<'a>>,
    /// Values, as `k`.
    pub v: Option<&'a Tensor<'a>>,
    /// Output, `[num_tokens, H, D]` of q's dtype.
    pub out: &'a mut TensorMut<'o>,
    /// Optional float32 `[num_tokens, H]`: the natural log of each softmax denominator.
    pub lse: Option<&'a mut TensorMut<'l>>,
}

impl<'a, 'o> ForwardArgs<'a, 'o, 'static> {
    /// The required arguments; no cache, layer 0, no k/v and no lse.
    pub fn new(
        batch: &'a Batch,
        options: &'a AttentionOptions<'a>,
        q: &'a Tensor<'a>,
        out: &'a mut TensorMut<'o>,
    ) -> Self {
        ForwardArgs { batch, cache: None, layer: 0, options, q, k: None, v: None, out, lse: None }
    }
}

/// The arguments of one [`Backend::forward_mla_with`](crate::Backend::forward_mla_with): what
/// `pagedattn_forward_mla` takes, by name.
///
/// [`MlaForwardArgs::new`] takes what every MLA forward needs (batch, latent cache, options,
/// q_nope, out) and leaves layer 0, no q_pe (whole query rows in `q_nope`) and no lse; the
/// setters fill them in:
///
/// ```no_run
/// # use pagedattn::{AttentionOptions, Backend, Batch, KvCache, MlaForwardArgs, Tensor, TensorMut};
/// # fn step(backend: &Backend, batch: &Batch, cache: &KvCache<'_>, q_nope: &Tensor<'_>,
/// #         q_pe: &Tensor<'_>, out: &mut TensorMut<'_>) -> Result<(), pagedattn::Error> {
/// let opts = AttentionOptions { scale: 0.1352, ..AttentionOptions::mla(16, 576) };
/// for layer in 0..4 {
///     backend.forward_mla_with(MlaForwardArgs::new(batch, cache, &opts, q_nope, out).q_pe(q_pe).layer(layer))?;
/// }
/// # Ok(()) }
/// ```
///
/// Lifetimes as [`ForwardArgs`].
#[derive(Debug)]
pub struct MlaForwardArgs<'a, 'o, 'l> {
    /// The planned step.
    pub batch: &'a Batch,
    /// The latent cache ([`crate::CacheDesc::LATENT`]), holding this step's rows already.
    pub cache: &'a KvCache<'a>,
    /// Layer of the cache.
    pub layer: usize,
    /// Shape and options ([`AttentionOptions::mla`]): `num_kv_heads` 1, `head_size` the rows'
    /// D, decoder; `k_scale` dequantises an fp8 cache; also the stream the work is queued on.
    pub options: &'a AttentionOptions<'a>,
    /// `[num_tokens, H, R]`: the query's no-rope part, already multiplied by W_UK; or, with
    /// `q_pe` `None`, whole query rows `[num_tokens, H, D]`.
    pub q_nope: &'a Tensor<'a>,
    /// `[num_tokens, H, D - R]`: the query's rotary part, or `None`.
    pub q_pe: Option<&'a Tensor<'a>>,
    /// Output, `[num_tokens, H, R]` of q's dtype: its last extent is the value size R.
    pub out: &'a mut TensorMut<'o>,
    /// Optional float32 `[num_tokens, H]`: the natural log of each softmax denominator.
    pub lse: Option<&'a mut TensorMut<'l>>,
}

impl<'a, 'o> MlaForwardArgs<'a, 'o, 'static> {
    /// The required arguments; layer 0, no q_pe and no lse.
    pub fn new(
        batch: &'a Batch,
        cache: &'a KvCache<'a>,
        options: &'a AttentionOptions<'a>,
        q_nope: &'a Tensor<'a>,
        out: &'a mut TensorMut<'o>,
    ) -> Self {
        MlaForwardArgs { batch, cache, layer: 0, options, q_nope, q_pe: None, out, lse: None }
    }
}

impl<'a, 'o, 'l> MlaForwardArgs<'a, 'o, 'l> {
    /// Sets the layer of the cache.
    pub fn layer(mut self, layer: usize) -> Self {
        self.layer = layer;
        self
    }

    /// Sets the query's rotary part (`q_nope` then holds the R leading values).
    pub fn q_pe(mut self, q_pe: &'a Tensor<'a>) -> Self {
        self.q_pe = Some(q_pe);
        self
    }

    /// Sets the lse output.
    pub fn lse<'m>(self, lse: &'a mut TensorMut<'m>) -> MlaForwardArgs<'a, 'o, 'm> {
        let MlaForwardArgs { batch, cache, layer, options, q_nope, q_pe, out, .. } = self;
        MlaForwardArgs { batch, cache, layer, options, q_nope, q_pe, out, lse: Some(lse) }
    }
}

impl<'a, 'o, 'l> ForwardArgs<'a, 'o, 'l> {
    /// Sets the cache.
    pub fn cache(mut self, cache: &'a KvCache<'a>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Sets the layer of the cache.
    pub fn layer(mut self, layer: usize) -> Self {
        self.layer = layer;
        self
    }

    /// Sets the step's keys and values.
    pub fn kv(mut self, k: &'a Tensor<'a>, v: &'a Tensor<'a>) -> Self {
        self.k = Some(k);
        self.v = Some(v);
        self
    }

    /// Sets the lse output.
    pub fn lse<'m>(self, lse: &'a mut TensorMut<'m>) -> ForwardArgs<'a, 'o, 'm> {
        let ForwardArgs { batch, cache, layer, options, q, k, v, out, .. } = self;
        ForwardArgs { batch, cache, layer, options, q, k, v, out, lse: Some(lse) }
    }
}
