//! Safe Rust bindings to libpagedattn: attention for LLM serving over a paged KV cache.
//!
//! The C API is wrapped one to one: a [`Backend`] creates [`KvCache`]s and plans [`Batch`]es;
//! [`Backend::forward_with`] runs one layer of attention (its arguments named in a
//! [`ForwardArgs`]), [`Backend::forward_mla_with`] runs multi-head latent attention over a
//! latent cache ([`CacheDesc::LATENT`], DeepSeek V2/V3, Kimi K2) and [`Backend::merge_states`]
//! combines partial results. Handles free themselves on drop. A backend is a shared handle that
//! each of its caches and batches holds a clone of, so they never outlive it and an engine can
//! own them all (`KvCache<'static>`, `Batch`); a lifetime keeps a wrapped cache from outliving
//! the memory it borrows. Every failure is an [`Error`] carrying the library's status and
//! message.
//!
//! Host tensors are slices described by [`Tensor`] (inputs) and [`TensorMut`] (outputs), of
//! `f32`, `half::f16`, `half::bf16` (feature `half`, on by default), or raw `u16` / `u8` bits
//! with an explicit [`DType`]; device memory goes through the `unsafe` raw constructors.
//!
//! # Integers
//!
//! Sizes, counts, layer indices and strides are `usize`; they are converted to the C fields'
//! `int32_t` / `int64_t` with checks, and a value that does not fit is an [`Error`] with
//! [`Status::Overflow`] ("num_blocks = 4294967296 does not fit int32") before anything reaches
//! the library. Arrays handed to C without a copy keep C's element type: `query_lens`,
//! `context_lens`, block tables and block ids are `i32`, slot mappings `i64`.
//!
//! # Threads
//!
//! The types are as concurrent as the C contract. [`Backend`], [`KvCache`], [`Batch`],
//! [`Tensor`], [`TensorMut`] and [`AttentionOptions`] are `Send + Sync`. Forwards and the cache's
//! writing calls take the cache by shared reference, so several threads may run forwards on one
//! cache at once (each with its own batch and output, as the C API asks): the library requires
//! that concurrent calls writing a cache touch disjoint blocks, which Rust cannot check. Breaking
//! it is the caller's logic error, as in C: the calls race on the slots they share, which end up
//! holding unspecified values; the cache holds plain numbers that never steer an address, so
//! nothing else is affected. A batch's `update` takes `&mut self`, as the C API needs exclusive
//! access. The C backend is destroyed when its last handle (a [`Backend`] clone, cache or batch)
//! is dropped, on whichever thread that is: backend.h allows destroying on any thread, and no
//! other handle, hence no concurrent call, is left by then.
//!
//! # Introspection and logging
//!
//! [`Backend::capabilities`] names the code path a backend runs ([`Capabilities::target`]: the
//! SIMD target on CPUs, which decides how results round; the architecture on GPUs) and every
//! choice and environment variable behind it ([`Capabilities::settings`]).
//! [`Backend::memory_usage`] counts the bytes, caches and batches a backend holds, and
//! [`BatchInfo`] the host and workspace bytes of one batch. [`set_log_callback`] sends the
//! library's messages to a closure: every failed call at [`LogLevel::Error`], backend creation
//! at [`LogLevel::Info`], caches and batches at [`LogLevel::Debug`].
//!
//! # Linking and running
//!
//! `pagedattn-sys` finds the library at build time through `PAGEDATTN_LIB_DIR` or `pkg-config
//! pagedattn` and links it dynamically, without an rpath (cargo never passes one to dependents):
//! the README's `build.rs` links one into the program, or install the library (`meson install`,
//! `ldconfig`) or set `LD_LIBRARY_PATH`. The `static` feature links `libpagedattn.a` into the
//! program instead, which then needs none of these; see `pagedattn_sys`'s documentation and the
//! README. Without the library, `cargo doc` and `cargo check` still work (the bindings are
//! pre-generated).
//!
//! ```no_run
//! use pagedattn::{AttentionOptions, Backend, Batch, BatchDesc, CacheDesc, DType, ForwardArgs,
//!                 KvCache, Tensor, TensorMut};
//! # fn main() -> Result<(), pagedattn::Error> {
//! let backend = Backend::new("cpu")?;
//! let desc = CacheDesc { num_layers: 1, num_blocks: 4, block_size: 16, num_kv_heads: 2,
//!                        head_size: 64, dtype: DType::F32, ..CacheDesc::default() };
//! let cache = KvCache::new(&backend, &desc)?;
//! let batch = Batch::new(&backend, Some(&cache), None, &BatchDesc {
//!     query_lens: &[1], context_lens: &[0], block_tables: Some(&[2]), block_table_stride: 1,
//!     ..BatchDesc::default() })?;
//! let (q, k, v) = (vec![0.5f32; 4 * 64], vec![0.1f32; 2 * 64], vec![0.2f32; 2 * 64]);
//! let mut out = vec![0f32; 4 * 64];
//! let opts = AttentionOptions::new(4, 2, 64);
//! let (q, k, v) = (Tensor::from_slice(&q, &[1, 4, 64])?, Tensor::from_slice(&k, &[1, 2, 64])?,
//!                  Tensor::from_slice(&v, &[1, 2, 64])?);
//! let mut out_t = TensorMut::from_slice(&mut out, &[1, 4, 64])?;
//! backend.forward_with(ForwardArgs::new(&batch, &opts, &q, &mut out_t).cache(&cache).layer(0).kv(&k, &v))?;
//! # Ok(()) }
//! ```
//!
//! # Owning the handles
//!
//! Caches and batches keep their backend alive, so an engine can hold them without a lifetime,
//! create them in one function and return them, or move them to another thread:
//!
//! ```
//! use pagedattn::{Backend, Batch, BatchDesc, CacheDesc, DType, KvCache};
//!
//! struct Engine {
//!     cache: KvCache<'static>,
//!     batch: Batch,
//! }
//!
//! fn engine() -> Result<Engine, pagedattn::Error> {
//!     let backend = Backend::new("cpu")?; // dropped here; the cache and batch keep it
//!     let cache = KvCache::new(&backend, &CacheDesc { num_layers: 1, num_blocks: 4, block_size: 16,
//!         num_kv_heads: 2, head_size: 64, dtype: DType::F32, ..CacheDesc::default() })?;
//!     let batch = Batch::new(&backend, Some(&cache), None, &BatchDesc {
//!         query_lens: &[1], context_lens: &[0], block_tables: Some(&[2]), block_table_stride: 1,
//!         ..BatchDesc::default() })?;
//!     Ok(Engine { cache, batch })
//! }
//! # fn main() -> Result<(), pagedattn::Error> {
//! let e = engine()?;
//! let usage = std::thread::spawn(move || e.batch.backend().memory_usage()).join().unwrap()?;
//! assert_eq!((usage.num_caches, usage.num_batches), (1, 1));
//! # Ok(()) }
//! ```
//!
//! A wrapped cache cannot let its memory be touched while it lives:
//!
//! ```compile_fail
//! # use pagedattn::{Backend, CacheDesc, KvCache};
//! let backend = Backend::new("cpu").unwrap();
//! let (mut k, mut v) = (vec![0f32; 64], vec![0f32; 64]);
//! let cache = KvCache::wrap(&backend, &CacheDesc::default(), vec![&mut k[..]], vec![&mut v[..]], None);
//! k[0] = 1.0; // error: `k` is borrowed mutably by the cache
//! drop(cache);
//! ```
//!
//! nor move to another thread past the memory's end:
//!
//! ```compile_fail
//! # use pagedattn::{Backend, CacheDesc, KvCache};
//! let backend = Backend::new("cpu").unwrap();
//! let (mut k, mut v) = (vec![0f32; 64], vec![0f32; 64]);
//! let cache = KvCache::wrap(&backend, &CacheDesc::default(), vec![&mut k[..]], vec![&mut v[..]], None).unwrap();
//! std::thread::spawn(move || drop(cache)); // error: `k` does not live long enough
//! ```
//!
//! and a batch cannot be updated while a forward may be using it:
//!
//! ```compile_fail
//! # use pagedattn::{Backend, Batch, BatchDesc};
//! let backend = Backend::new("cpu").unwrap();
//! let mut batch = Batch::new(&backend, None, None, &BatchDesc::default()).unwrap();
//! std::thread::scope(|s| {
//!     s.spawn(|| batch.info());
//!     batch.update(&BatchDesc::default()); // error: `batch` is also borrowed as shared
//! });
//! ```

#![deny(missing_docs)]

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

pub use pagedattn_sys as sys;

mod attention;
mod backend;
mod batch;
mod cache;
mod log;
mod tensor;

pub use attention::{AttentionOptions, AttentionType, ForwardArgs, MlaForwardArgs};
pub use backend::{backends, Backend, BackendInfo, BackendOptions, Capabilities, Features, MemoryUsage};
pub use batch::{pack_tree_masks, Batch, BatchDesc, BatchInfo};
pub use cache::{CacheDesc, KvCache, Layout, LayerMemory};
pub use log::{set_log_callback, LogCallback, LogLevel};
pub use tensor::{DataType, Device, DeviceType, Element, NativeElement, Stream, Tensor, TensorMut};

/// The README's examples, compiled and run as doctests so that they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// `value` as a C `int32_t` field or argument named `what`, or an [`Status::Overflow`] error.
pub(crate) fn to_c_i32(what: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::binding(Status::Overflow, format!("{what} = {value} does not fit int32")))
}

/// `value` as a C `int64_t` field or argument named `what`, or an [`Status::Overflow`] error.
pub(crate) fn to_c_i64(what: &str, value: usize) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::binding(Status::Overflow, format!("{what} = {value} does not fit int64")))
}

/// A count or size the library reported, as `usize`; a negative one is a library bug.
pub(crate) fn from_c<T: Copy + fmt::Display + TryInto<usize>>(what: &str, value: T) -> Result<usize> {
    value
        .try_into()
        .map_err(|_| Error::binding(Status::Internal, format!("the library reported {what} = {value}")))
}

/// Status of a failed call: the C library's `pagedattn_status` codes (values pinned forever).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A value is outside what the call accepts.
    InvalidArgument,
    /// A required handle or pointer is NULL.
    NullPointer,
    /// An option struct has an unknown `struct_size`.
    StructSize,
    /// A tensor has the wrong rank, shape, dtype, or a non-unit innermost stride.
    BadTensor,
    /// A tensor or cache lives on a device the backend cannot use for this call.
    WrongDevice,
    /// A block id, slot, layer index or pair lies outside the cache.
    OutOfRange,
    /// Sizes whose product or sum overflows the index types.
    Overflow,
    /// The backend lacks this head size, block size, dtype or feature.
    Unsupported,
    /// A batch update exceeds the capacity the batch was planned for.
    Capacity,
    /// Host or device memory could not be allocated.
    OutOfMemory,
    /// No backend of that name exists.
    UnknownBackend,
    /// The backend exists but cannot run here.
    BackendUnavailable,
    /// A plugin is missing, fails to load, or fails its init.
    Plugin,
    /// A plugin was built for another plugin ABI version.
    PluginAbi,
    /// The device runtime reported an error.
    Device,
    /// A handle was destroyed, is of the wrong kind, or belongs to another backend.
    InvalidHandle,
    /// A bug in pagedattn.
    Internal,
    /// A code this binding does not know (a newer library).
    Unknown(u32),
}

impl Status {
    /// Maps a C status code (not `PAGEDATTN_OK`) to a `Status`.
    pub fn from_code(code: u32) -> Status {
        use Status::*;
        match code {
            1 => InvalidArgument,
            2 => NullPointer,
            3 => StructSize,
            4 => BadTensor,
            5 => WrongDevice,
            6 => OutOfRange,
            7 => Overflow,
            8 => Unsupported,
            9 => Capacity,
            10 => OutOfMemory,
            11 => UnknownBackend,
            12 => BackendUnavailable,
            13 => Plugin,
            14 => PluginAbi,
            15 => Device,
            16 => InvalidHandle,
            17 => Internal,
            other => Unknown(other),
        }
    }

    /// The C status code.
    pub fn code(self) -> u32 {
        use Status::*;
        match self {
            InvalidArgument => 1,
            NullPointer => 2,
            StructSize => 3,
            BadTensor => 4,
            WrongDevice => 5,
            OutOfRange => 6,
            Overflow => 7,
            Unsupported => 8,
            Capacity => 9,
            OutOfMemory => 10,
            UnknownBackend => 11,
            BackendUnavailable => 12,
            Plugin => 13,
            PluginAbi => 14,
            Device => 15,
            InvalidHandle => 16,
            Internal => 17,
            Unknown(code) => code,
        }
    }

    /// The C constant's name, e.g. `"PAGEDATTN_ERROR_BAD_TENSOR"` (from `pagedattn_status_string`).
    pub fn name(self) -> &'static str {
        // SAFETY: the library returns a static, never-NULL string for any value.
        unsafe { static_str(sys::pagedattn_status_string(self.code())) }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: the status and the library's message (`pagedattn_last_error`), read on the
/// same thread right after the failing call. Checks done by this binding before calling the
/// library (slice lengths, for memory safety) use the same statuses and say so in the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What kind of failure.
    pub status: Status,
    /// What was wrong and why.
    pub message: String,
}

impl Error {
    /// An error raised by this binding itself (never by the library).
    pub(crate) fn binding(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: format!("pagedattn (Rust binding): {}", message.into()) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// Result of every fallible call.
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a raw status into a `Result`, reading the thread's last error message on failure.
/// Useful when mixing calls through [`sys`] with this crate.
pub fn check(status: sys::pagedattn_status) -> Result<()> {
    if status == sys::PAGEDATTN_OK {
        Ok(())
    } else {
        Err(Error { status: Status::from_code(status), message: last_error() })
    }
}

/// The message of the last failed call on this thread ("" after a success).
pub fn last_error() -> String {
    // SAFETY: never NULL; valid until the next call on this thread, and copied at once.
    unsafe { CStr::from_ptr(sys::pagedattn_last_error()).to_string_lossy().into_owned() }
}

/// Converts a static C string owned by the library.
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string that lives forever.
pub(crate) unsafe fn static_str(ptr: *const c_char) -> &'static str {
    if ptr.is_null() {
        ""
    } else {
        CStr::from_ptr(ptr).to_str().unwrap_or("")
    }
}

/// Copies a C string the library owns for at least the call ("" for NULL; invalid UTF-8 is
/// replaced, not refused, as it only describes).
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string valid for the duration of the call.
pub(crate) unsafe fn owned_str(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    }
}

/// A library version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible API changes.
    pub major: i32,
    /// Additions.
    pub minor: i32,
    /// Fixes.
    pub patch: i32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of the library loaded at run time (`pagedattn_version`).
pub fn version() -> Version {
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: plain out-parameters; cannot fail.
    unsafe { sys::pagedattn_version(&mut major, &mut minor, &mut patch) };
    Version { major, minor, patch }
}

/// The run-time library's version string, e.g. `"0.2.0"`.
pub fn version_string() -> &'static str {
    // SAFETY: static string owned by the library.
    unsafe { static_str(sys::pagedattn_version_string()) }
}

/// The version of the headers these bindings were generated from. Its major version must equal
/// [`version()`]'s.
pub const HEADER_VERSION: Version = Version {
    major: sys::PAGEDATTN_VERSION_MAJOR as i32,
    minor: sys::PAGEDATTN_VERSION_MINOR as i32,
    patch: sys::PAGEDATTN_VERSION_PATCH as i32,
};

/// Element types of caches and tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE float32.
    F32,
    /// IEEE float16 (held in `half::f16`, or its bits in `u16`).
    F16,
    /// bfloat16 (held in `half::bf16`, or its bits in `u16`).
    BF16,
    /// fp8 e4m3 (finite, max 448); caches only, held in `u8`.
    Fp8E4M3,
    /// fp8 e5m2; caches only, held in `u8`.
    Fp8E5M2,
}

impl DType {
    /// All dtypes, in C enum order.
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::Fp8E4M3, DType::Fp8E5M2];

    /// The C `pagedattn_dtype` value.
    pub fn raw(self) -> sys::pagedattn_dtype {
        match self {
            DType::F32 => sys::PAGEDATTN_DTYPE_FLOAT32,
            DType::F16 => sys::PAGEDATTN_DTYPE_FLOAT16,
            DType::BF16 => sys::PAGEDATTN_DTYPE_BFLOAT16,
            DType::Fp8E4M3 => sys::PAGEDATTN_DTYPE_FP8_E4M3,
            DType::Fp8E5M2 => sys::PAGEDATTN_DTYPE_FP8_E5M2,
        }
    }

    /// Maps a C `pagedattn_dtype`; `None` for `PAGEDATTN_DTYPE_INVALID` or an unknown value.
    pub fn from_raw(raw: sys::pagedattn_dtype) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.raw() == raw)
    }

    /// The library's name for it ("float32", "bfloat16", "fp8_e4m3"...).
    pub fn name(self) -> &'static str {
        // SAFETY: static string owned by the library.
        unsafe { static_str(sys::pagedattn_dtype_name(self.raw())) }
    }

    /// Bytes per element (`pagedattn_dtype_size`).
    pub fn size(self) -> usize {
        // SAFETY: pure function of a valid dtype.
        unsafe { sys::pagedattn_dtype_size(self.raw()) }
    }

    /// The DLPack type tensors of this dtype carry (`pagedattn_dtype_to_dlpack`).
    pub fn to_dlpack(self) -> DataType {
        let mut out = sys::pagedattn_dlpack_dtype::default();
        // SAFETY: valid out pointer; every DType maps.
        let status = unsafe { sys::pagedattn_dtype_to_dlpack(&mut out, self.raw()) };
        debug_assert_eq!(status, sys::PAGEDATTN_OK);
        DataType { code: out.code, bits: out.bits, lanes: out.lanes }
    }

    /// The dtype of a DLPack type (`pagedattn_dtype_from_dlpack`); an error for types the
    /// library has no use for.
    pub fn from_dlpack(dtype: DataType) -> Result<DType> {
        let mut out: sys::pagedattn_dtype = 0;
        let raw = sys::pagedattn_dlpack_dtype { code: dtype.code, bits: dtype.bits, lanes: dtype.lanes };
        // SAFETY: valid out pointer.
        check(unsafe { sys::pagedattn_dtype_from_dlpack(&mut out, raw) })?;
        DType::from_raw(out).ok_or_else(|| Error::binding(Status::Unsupported, format!("dtype code {out}")))
    }

    /// Bit of this dtype in capability masks (`PAGEDATTN_DTYPE_BIT`).
    pub fn bit(self) -> u32 {
        1u32 << self.raw()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
