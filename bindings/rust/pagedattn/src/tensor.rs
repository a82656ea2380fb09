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
        (self.bits as usize * self.lanes as usize).div_ceil(8)
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
}

/// Host element types that can back a tensor or cache: `f32` (float32), `u16` (the bits of
/// float16 or bfloat16, chosen by an explicit [`DType`]) and `u8` (fp8 caches).
pub trait Element: Copy + sealed::Sealed + 'static {
    /// Whether values of `dtype` are stored in this Rust type.
    fn holds(dtype: DType) -> bool;
}

impl Element for f32 {
    fn holds(dtype: DType) -> bool {
        dtype == DType::F32
    }
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
        last = last.checked_add((n - 1).checked_mul(s)?)?;
    }
    usize::try_from(last.checked_add(1)?).ok()
}

fn to_i64(dims: &[usize]) -> Result<Vec<i64>> {
    dims.iter()
        .map(|&d| i64::try_from(d).map_err(|_| Error::binding(Status::Overflow, format!("dimension {d}"))))
        .collect()
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

impl<'a> Tensor<'a> {
    fn host(data: *mut c_void, len: usize, dtype: DataType, shape: &[usize], strides: Option<&[usize]>) -> Result<Self> {
        let shape = to_i64(shape)?;
        let need = match strides {
            None => shape.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n as usize)),
            Some(strides) => {
                if strides.len() != shape.len() {
                    return Err(Error::binding(
                        Status::BadTensor,
                        format!("{} strides for {} dimensions", strides.len(), shape.len()),
                    ));
                }
                extent(&shape, &to_i64(strides)?)
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
            strides: strides.map(to_i64).transpose()?,
            byte_offset: 0,
            _data: PhantomData,
        })
    }

    /// A compact row-major view of `data` with the given shape (`data.len()` must equal the
    /// product of `shape`). `dtype` says how the elements are encoded (`u16` holds float16 or
    /// bfloat16).
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

    /// A view of arbitrary memory, e.g. on a GPU. `strides` in elements (None = compact).
    ///
    /// # Safety
    /// `data` must point to memory on `device` holding every element the view reaches, readable
    /// (and writable, if used as an output) for `'a` and, on GPU backends, until queued work
    /// using it has finished.
    pub unsafe fn from_raw_parts(
        data: *mut c_void,
        device: Device,
        dtype: DataType,
        shape: &[i64],
        strides: Option<&[i64]>,
        byte_offset: u64,
    ) -> Self {
        Tensor {
            data,
            device,
            dtype,
            shape: shape.to_vec(),
            strides: strides.map(<[i64]>::to_vec),
            byte_offset,
            _data: PhantomData,
        }
    }

    /// A view of a DLPack `DLTensor` (laid out like `pagedattn_tensor`), e.g. from a framework.
    /// Shape and strides are copied; the data is not.
    ///
    /// # Safety
    /// `tensor` must point to a valid `DLTensor` whose data satisfies [`Tensor::from_raw_parts`].
    pub unsafe fn from_dlpack(tensor: *const sys::pagedattn_tensor) -> Self {
        let t = &*tensor;
        let ndim = t.ndim.max(0) as usize;
        let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(t.shape, ndim) };
        let strides = if t.strides.is_null() || ndim == 0 {
            None
        } else {
            Some(std::slice::from_raw_parts(t.strides, ndim))
        };
        let dtype = DataType { code: t.dtype.code, bits: t.dtype.bits, lanes: t.dtype.lanes };
        Tensor::from_raw_parts(t.data, Device::from_raw(t.device), dtype, shape, strides, t.byte_offset)
    }

    /// The shape.
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
    pub fn nbytes(&self) -> usize {
        let n = match &self.strides {
            None => self.shape.iter().product::<i64>().max(0) as usize,
            Some(s) => extent(&self.shape, s).unwrap_or(0),
        };
        n * self.dtype.bytes()
    }

    /// The C descriptor; it points into `self`, so it is valid while `self` is borrowed.
    pub fn as_raw(&self) -> sys::pagedattn_tensor {
        sys::pagedattn_tensor {
            data: self.data,
            device: self.device.raw(),
            ndim: self.shape.len() as i32,
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

impl<'a> TensorMut<'a> {
    fn wrap(inner: Tensor<'a>) -> Self {
        TensorMut { inner, _data: PhantomData }
    }

    /// A compact row-major view of `data` (its length must equal the product of `shape`).
    pub fn new<T: Element>(data: &'a mut [T], dtype: DType, shape: &[usize]) -> Result<Self> {
        check_element::<T>(dtype)?;
        Tensor::host(data.as_mut_ptr() as *mut c_void, data.len(), dtype.into(), shape, None).map(Self::wrap)
    }

    /// A strided view of `data` (element strides; every element reached must lie inside).
    pub fn with_strides<T: Element>(data: &'a mut [T], dtype: DType, shape: &[usize], strides: &[usize]) -> Result<Self> {
        check_element::<T>(dtype)?;
        Tensor::host(data.as_mut_ptr() as *mut c_void, data.len(), dtype.into(), shape, Some(strides)).map(Self::wrap)
    }

    /// A writable view of arbitrary memory.
    ///
    /// # Safety
    /// As [`Tensor::from_raw_parts`], and the memory must be writable and not otherwise accessed
    /// while the library may write it.
    pub unsafe fn from_raw_parts(
        data: *mut c_void,
        device: Device,
        dtype: DataType,
        shape: &[i64],
        strides: Option<&[i64]>,
        byte_offset: u64,
    ) -> Self {
        Self::wrap(Tensor::from_raw_parts(data, device, dtype, shape, strides, byte_offset))
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
