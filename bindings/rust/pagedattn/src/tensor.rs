//! Tensor descriptors (DLPack `DLTensor` layout) over host slices or raw device memory.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use crate::{sys, DType, Error, Result, Status};

/// A DLPack element type: `{code, bits, lanes}` with DLPack's codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataType {
    /// `PAGEDATTN_DLPACK_*` (int 0, uint 1, float 2, bfloat 4, fp8 10/12).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes; always 1 for pagedattn.
    pub lanes: u16,
}

impl DataType {
    /// 32-bit signed integer (slot mappings).
    pub const I32: DataType = DataType { code: sys::PAGEDATTN_DLPACK_INT as u8, bits: 32, lanes: 1 };
    /// 64-bit signed integer (slot mappings).
    pub const I64: DataType = DataType { code: sys::PAGEDATTN_DLPACK_INT as u8, bits: 64, lanes: 1 };

    fn bytes(self) -> usize {
        (usize::from(self.bits) * usize::from(self.lanes)).div_ceil(8)
    }
}

impl From<DType> for DataType {
    fn from(dtype: DType) -> DataType {
        dtype.to_dlpack()
    }
}

/// Kinds of device (DLPack's `DLDeviceType` codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// Host memory.
    Cpu,
    /// NVIDIA GPU memory.
    Cuda,
    /// Pinned host memory visible to CUDA.
    CudaHost,
    /// AMD GPU memory.
    Rocm,
    /// Pinned host memory visible to ROCm.
    RocmHost,
    /// Another DLPack device code.
    Other(i32),
}

impl DeviceType {
    /// The DLPack code.
    pub fn code(self) -> i32 {
        match self {
            DeviceType::Cpu => sys::PAGEDATTN_DEVICE_CPU as i32,
            DeviceType::Cuda => sys::PAGEDATTN_DEVICE_CUDA as i32,
            DeviceType::CudaHost => sys::PAGEDATTN_DEVICE_CUDA_HOST as i32,
            DeviceType::Rocm => sys::PAGEDATTN_DEVICE_ROCM as i32,
            DeviceType::RocmHost => sys::PAGEDATTN_DEVICE_ROCM_HOST as i32,
            DeviceType::Other(code) => code,
        }
    }

    /// Maps a DLPack code.
    pub fn from_code(code: i32) -> DeviceType {
        [DeviceType::Cpu, DeviceType::Cuda, DeviceType::CudaHost, DeviceType::Rocm, DeviceType::RocmHost]
            .into_iter()
            .find(|d| d.code() == code)
            .unwrap_or(DeviceType::Other(code))
    }
}

/// Where memory lives: a device type and ordinal (DLPack's `DLDevice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    /// The kind of device.
    pub device_type: DeviceType,
    /// Its ordinal (0 for host memory).
    pub id: i32,
}

impl Device {
    /// Host memory.
    pub const CPU: Device = Device { device_type: DeviceType::Cpu, id: 0 };

    pub(crate) fn raw(self) -> sys::pagedattn_device {
        sys::pagedattn_device { device_type: self.device_type.code(), device_id: self.id }
    }

    pub(crate) fn from_raw(raw: sys::pagedattn_device) -> Device {
        Device { device_type: DeviceType::from_code(raw.device_type), id: raw.device_id }
    }
}

/// A GPU stream (`cudaStream_t` / `hipStream_t`) on which calls queue their work. CPU backends
/// ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(*mut c_void);

// SAFETY: a stream handle is an opaque token that CUDA/HIP accept from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above; the library never dereferences it on the Rust side.
unsafe impl Sync for Stream {}

impl Stream {
    /// The device's default stream (NULL).
    pub const DEFAULT: Stream = Stream(ptr::null_mut());

    /// Wraps a raw stream handle.
    ///
    /// # Safety
    /// `raw` must be NULL or a live stream of the device of the backend it is used with, for as
    /// long as calls use it.
    pub unsafe fn from_raw(raw: *mut c_void) -> Stream {
        Stream(raw)
    }

    /// The raw handle.
    pub fn as_ptr(self) -> *mut c_void {
        self.0
    }
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::DEFAULT
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
    #[cfg(feature = "half")]
    impl Sealed for half::f16 {}
    #[cfg(feature = "half")]
    impl Sealed for half::bf16 {}
}

/// Host element types that can back a tensor or cache: `f32` (float32), `half::f16` (float16)
/// and `half::bf16` (bfloat16) with the feature `half`, `u16` (the bits of float16 or bfloat16,
/// chosen by an explicit [`DType`]) and `u8` (fp8 caches).
pub trait Element: Copy + Send + Sync + sealed::Sealed + 'static {
    /// Whether values of `dtype` are stored in this Rust type.
    fn holds(dtype: DType) -> bool;
}

/// An [`Element`] that fixes its dtype, so that constructors need none: `f32`, `half::f16`,
/// `half::bf16`. The raw `u16` and `u8` carry several dtypes and take an explicit one.
pub trait NativeElement: Element {
    /// The dtype of this type's values.
    const DTYPE: DType;
}

impl Element for f32 {
    fn holds(dtype: DType) -> bool {
        dtype == DType::F32
    }
}

impl NativeElement for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for u16 {
    fn holds(dtype: DType) -> bool {
        matches!(dtype, DType::F16 | DType::BF16)
    }
}

impl Element for u8 {
    fn holds(dtype: DType) -> bool {
        matches!(dtype, DType::Fp8E4M3 | DType::Fp8E5M2)
    }
}

#[cfg(feature = "half")]
impl Element for half::f16 {
    fn holds(dtype: DType) -> bool {
        dtype == DType::F16
    }
}

#[cfg(feature = "half")]
impl NativeElement for half::f16 {
    const DTYPE: DType = DType::F16;
}

#[cfg(feature = "half")]
impl Element for half::bf16 {
    fn holds(dtype: DType) -> bool {
        dtype == DType::BF16
    }
}

#[cfg(feature = "half")]
impl NativeElement for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

pub(crate) fn check_element<T: Element>(dtype: DType) -> Result<()> {
    if T::holds(dtype) {
        Ok(())
    } else {
        Err(Error::binding(
            Status::BadTensor,
            format!("a slice of {} cannot hold {} elements", std::any::type_name::<T>(), dtype.name()),
        ))
    }
}

/// Number of elements a strided view reaches (max offset + 1), or None on overflow.
fn extent(shape: &[i64], strides: &[i64]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last: i64 = 0;
    for (&n, &s) in shape.iter().zip(strides) {
        last = last.checked_add(n.checked_sub(1)?.checked_mul(s)?)?;
    }
    usize::try_from(last.checked_add(1)?).ok()
}

/// `dims` as DLPack's int64, or an [`Status::Overflow`] error naming `what`.
fn to_i64(what: &str, dims: &[usize]) -> Result<Vec<i64>> {
    dims.iter().map(|&d| crate::to_c_i64(what, d)).collect()
}

/// An input tensor: a DLPack-style view (data, device, dtype, shape, element strides) that the
/// library only reads. Built over a host slice (safe, bounds-checked) or raw memory (`unsafe`).
#[derive(Debug)]
pub struct Tensor<'a> {
    data: *mut c_void,
    device: Device,
    dtype: DataType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    _data: PhantomData<&'a [u8]>,
}

// SAFETY: a Tensor is a read-only view like `&'a [T]` over element types that are Sync; for
// memory given through the unsafe constructors, their contract covers every thread.
unsafe impl Send for Tensor<'_> {}
// SAFETY: as Send; `&Tensor` only reads the descriptor.
unsafe impl Sync for Tensor<'_> {}

impl<'a> Tensor<'a> {
    fn host(data: *mut c_void, len: usize, dtype: DataType, shape: &[usize], strides: Option<&[usize]>) -> Result<Self> {
        let shape = to_i64("shape", shape)?;
        let need = match strides {
            None => shape.iter().try_fold(1usize, |acc, &n| acc.checked_mul(usize::try_from(n).ok()?)),
            Some(strides) => {
                if strides.len() != shape.len() {
                    return Err(Error::binding(
                        Status::BadTensor,
                        format!("{} strides for {} dimensions", strides.len(), shape.len()),
                    ));
                }
                extent(&shape, &to_i64("strides", strides)?)
            }
        }
        .ok_or_else(|| Error::binding(Status::Overflow, "tensor size overflows"))?;
        let fits = if strides.is_none() { len == need } else { len >= need };
        if !fits {
            return Err(Error::binding(
                Status::BadTensor,
                format!("slice of {len} elements does not match shape {shape:?} ({need} elements)"),
            ));
        }
        Ok(Tensor {
            data,
            device: Device::CPU,
            dtype,
            shape,
            strides: strides.map(|s| to_i64("strides", s)).transpose()?,
            byte_offset: 0,
            _data: PhantomData,
        })
    }

    /// A compact row-major view of `data` with the given shape (`data.len()` must equal the
    /// product of `shape`), of `T`'s own dtype: `f32`, `half::f16` or `half::bf16`.
    pub fn from_slice<T: NativeElement>(data: &'a [T], shape: &[usize]) -> Result<Self> {
        Tensor::new(data, T::DTYPE, shape)
    }

    /// As [`Tensor::from_slice`], with the dtype given: needed for raw `u16` bits, which hold
    /// float16 or bfloat16; an error when `T` cannot hold `dtype`.
    pub fn new<T: Element>(data: &'a [T], dtype: DType, shape: &[usize]) -> Result<Self> {
        check_element::<T>(dtype)?;
        Tensor::host(data.as_ptr() as *mut c_void, data.len(), dtype.into(), shape, None)
    }

    /// A strided view of `data` (element strides, innermost 1; every element reached must lie
    /// inside `data`).
    pub fn with_strides<T: Element>(data: &'a [T], dtype: DType, shape: &[usize], strides: &[usize]) -> Result<Self> {
        check_element::<T>(dtype)?;
        Tensor::host(data.as_ptr() as *mut c_void, data.len(), dtype.into(), shape, Some(strides))
    }

    /// A 1-D int64 tensor (a slot mapping).
    pub fn from_i64(data: &'a [i64]) -> Self {
        Tensor::host(data.as_ptr() as *mut c_void, data.len(), DataType::I64, &[data.len()], None)
            .expect("a 1-D slice always matches its length")
    }

    /// A 1-D int32 tensor (a slot mapping).
    pub fn from_i32(data: &'a [i32]) -> Self {
        Tensor::host(data.as_ptr() as *mut c_void, data.len(), DataType::I32, &[data.len()], None)
            .expect("a 1-D slice always matches its length")
    }

    /// A view of arbitrary memory, e.g. on a GPU: `shape` and `strides` (in elements; `None` =
    /// compact) as `usize`, checked to fit DLPack's int64.
    ///
    /// # Safety
    /// `data` must point to memory on `device` holding every element the view reaches, readable
    /// (and writable, if used as an output) for `'a` from any thread the view is sent to and, on
    /// GPU backends, until queued work using it has finished.
    pub unsafe fn from_raw_parts(
        data: *mut c_void,
        device: Device,
        dtype: DataType,
        shape: &[usize],
        strides: Option<&[usize]>,
        byte_offset: u64,
    ) -> Result<Self> {
        let strides = strides.map(|s| to_i64("strides", s)).transpose()?;
        Ok(Tensor::raw(data, device, dtype, to_i64("shape", shape)?, strides, byte_offset))
    }

    fn raw(data: *mut c_void, device: Device, dtype: DataType, shape: Vec<i64>, strides: Option<Vec<i64>>,
           byte_offset: u64) -> Self {
        Tensor { data, device, dtype, shape, strides, byte_offset, _data: PhantomData }
    }

    /// A view of a DLPack `DLTensor` (laid out like `pagedattn_tensor`), e.g. from a framework.
    /// Shape and strides are copied; the data is not.
    ///
    /// # Safety
    /// `tensor` must point to a valid `DLTensor` whose data satisfies [`Tensor::from_raw_parts`].
    pub unsafe fn from_dlpack(tensor: *const sys::pagedattn_tensor) -> Self {
        let t = &*tensor;
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(t.shape, ndim) };
        let strides = if t.strides.is_null() || ndim == 0 {
            None
        } else {
            Some(std::slice::from_raw_parts(t.strides, ndim))
        };
        let dtype = DataType { code: t.dtype.code, bits: t.dtype.bits, lanes: t.dtype.lanes };
        Tensor::raw(t.data, Device::from_raw(t.device), dtype, shape.to_vec(), strides.map(<[i64]>::to_vec),
                    t.byte_offset)
    }

    /// The shape, as the descriptor holds it (DLPack's int64).
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Size of the view's reach in bytes (for callers checking buffers).
    /// 0 for a shape that is negative or overflows.
    pub fn nbytes(&self) -> usize {
        let n = match &self.strides {
            None => self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?)),
            Some(s) => extent(&self.shape, s),
        };
        n.and_then(|n| n.checked_mul(self.dtype.bytes())).unwrap_or(0)
    }

    /// The C descriptor; it points into `self`, so it is valid while `self` is borrowed.
    pub fn as_raw(&self) -> sys::pagedattn_tensor {
        sys::pagedattn_tensor {
            data: self.data,
            device: self.device.raw(),
            // More than i32::MAX dimensions cannot be described; C reads no more than ndim.
            ndim: i32::try_from(self.shape.len()).unwrap_or(i32::MAX),
            dtype: sys::pagedattn_dlpack_dtype { code: self.dtype.code, bits: self.dtype.bits, lanes: self.dtype.lanes },
            // The library only reads shape and strides; the C type is non-const for DLPack.
            shape: self.shape.as_ptr() as *mut i64,
            strides: self.strides.as_ref().map_or(ptr::null_mut(), |s| s.as_ptr() as *mut i64),
            byte_offset: self.byte_offset,
        }
    }
}

/// An output tensor: like [`Tensor`], over memory the library may write (a `&mut` slice, or raw
/// memory through `unsafe`).
#[derive(Debug)]
pub struct TensorMut<'a> {
    inner: Tensor<'a>,
    _data: PhantomData<&'a mut [u8]>,
}

// SAFETY: a TensorMut is an exclusive view like `&'a mut [T]` over Send + Sync element types;
// `&TensorMut` gives only read access (as_tensor), writing needs `&mut`.
unsafe impl Send for TensorMut<'_> {}
// SAFETY: as Send.
unsafe impl Sync for TensorMut<'_> {}

impl<'a> TensorMut<'a> {
    fn wrap(inner: Tensor<'a>) -> Self {
        TensorMut { inner, _data: PhantomData }
    }

    /// A compact row-major view of `data` (its length must equal the product of `shape`), of
    /// `T`'s own dtype: `f32`, `half::f16` or `half::bf16`.
    pub fn from_slice<T: NativeElement>(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        TensorMut::new(data, T::DTYPE, shape)
    }

    /// As [`TensorMut::from_slice`], with the dtype given (raw `u16` bits of float16 or
    /// bfloat16); an error when `T` cannot hold `dtype`.
    pub fn new<T: Element>(data: &'a mut [T], dtype: DType, shape: &[usize]) -> Result<Self> {
        check_element::<T>(dtype)?;
        Tensor::host(data.as_mut_ptr() as *mut c_void, data.len(), dtype.into(), shape, None).map(Self::wrap)
    }

    /// A strided view of `data` (element strides; every element reached must lie inside).
    pub fn with_strides<T: Element>(data: &'a mut [T], dtype: DType, shape: &[usize], strides: &[usize]) -> Result<Self> {
        check_element::<T>(dtype)?;
        Tensor::host(data.as_mut_ptr() as *mut c_void, data.len(), dtype.into(), shape, Some(strides)).map(Self::wrap)
    }

    /// A writable view of arbitrary memory (see [`Tensor::from_raw_parts`]).
    ///
    /// # Safety
    /// As [`Tensor::from_raw_parts`], and the memory must be writable and not otherwise accessed
    /// while the library may write it.
    pub unsafe fn from_raw_parts(
        data: *mut c_void,
        device: Device,
        dtype: DataType,
        shape: &[usize],
        strides: Option<&[usize]>,
        byte_offset: u64,
    ) -> Result<Self> {
        Tensor::from_raw_parts(data, device, dtype, shape, strides, byte_offset).map(Self::wrap)
    }

    /// A writable view of a DLPack `DLTensor`.
    ///
    /// # Safety
    /// As [`Tensor::from_dlpack`], with writable memory.
    pub unsafe fn from_dlpack(tensor: *const sys::pagedattn_tensor) -> Self {
        Self::wrap(Tensor::from_dlpack(tensor))
    }

    /// Read-only view of the same descriptor.
    pub fn as_tensor(&self) -> &Tensor<'a> {
        &self.inner
    }

    /// The C descriptor (valid while `self` is borrowed).
    pub fn as_raw(&mut self) -> sys::pagedattn_tensor {
        self.inner.as_raw()
    }
}
