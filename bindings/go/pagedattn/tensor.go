package pagedattn

import (
	"runtime"
	"unsafe"
)

// Tensor describes memory the library reads or writes: data, device, DLPack type, shape and
// element strides (DLPack's DLTensor). Build one over a Go slice with Float32Tensor,
// BFloat16Tensor, Float16Tensor or HostTensor, which check the shape against the slice and keep
// any error in the tensor: the call that receives it (Forward, Write, MergeStates) returns that
// error, so a call site needs one error check, not one per tensor. NewTensor checks at once
// instead. TensorFromPointer describes other memory.
type Tensor struct {
	data       unsafe.Pointer
	keep       interface{} // the Go slice behind data, kept alive across calls
	device     Device
	dtype      DataType
	shape      []int64
	strides    []int64
	byteOffset uint64
	err        error // why the constructor refused the description; nil if valid
}

// Err returns why the tensor's constructor refused it (an *Error with code BadTensor), or nil.
// Calls given a refused tensor return this error without reaching the library.
func (t *Tensor) Err() error {
	if t == nil {
		return nil
	}
	return t.err
}

// Element is a Go type that can hold tensor elements: float32, uint16 (the bits of float16 or
// bfloat16, chosen by the dtype) and uint8 (fp8).
type Element interface {
	float32 | uint16 | uint8
}

func holds(size uintptr, d DType) bool {
	switch d {
	case Float32:
		return size == 4
	case Float16, BFloat16:
		return size == 2
	case FP8E4M3, FP8E5M2:
		return size == 1
	}
	return false
}

func hostTensor(ptr unsafe.Pointer, keep interface{}, n int, dt DataType, shape, strides []int) (*Tensor, error) {
	if len(shape) > maxDims {
		return nil, goError(BadTensor, "%d dimensions (at most %d)", len(shape), maxDims)
	}
	t := &Tensor{data: ptr, keep: keep, device: HostDevice, dtype: dt}
	need := 1
	for _, d := range shape {
		if d < 0 {
			return nil, goError(BadTensor, "negative dimension in %v", shape)
		}
		t.shape = append(t.shape, int64(d))
		need *= d
	}
	if strides == nil {
		if need != n {
			return nil, goError(BadTensor, "slice of %d elements does not match shape %v (%d elements)", n, shape, need)
		}
		return t, nil
	}
	if len(strides) != len(shape) {
		return nil, goError(BadTensor, "%d strides for %d dimensions", len(strides), len(shape))
	}
	t.strides = make([]int64, len(strides))
	empty, last := false, 0
	for i, s := range strides {
		if s < 0 {
			return nil, goError(BadTensor, "negative stride in %v", strides)
		}
		t.strides[i] = int64(s)
		if shape[i] == 0 {
			empty = true
		} else {
			last += (shape[i] - 1) * s
		}
	}
	if !empty && last >= n {
		return nil, goError(BadTensor, "strides %v of shape %v reach element %d of a %d-element slice", strides, shape, last, n)
	}
	return t, nil
}

func slicePtr[T any](data []T) unsafe.Pointer {
	if len(data) == 0 {
		return nil
	}
	return unsafe.Pointer(&data[0])
}

// HostTensor describes a compact row-major tensor over data (len(data) must equal the product of
// shape). dtype says how the elements are encoded: float32 slices hold Float32, uint16 slices
// Float16 or BFloat16, uint8 slices fp8. It never returns nil: a description that does not fit
// data yields a tensor whose Err is set, and which every call refuses with that error.
func HostTensor[T Element](data []T, dtype DType, shape ...int) *Tensor {
	t, err := NewTensor(data, dtype, shape...)
	if err != nil {
		return &Tensor{err: err}
	}
	return t
}

// Float32Tensor is HostTensor(data, Float32, shape...).
func Float32Tensor(data []float32, shape ...int) *Tensor { return HostTensor(data, Float32, shape...) }

// BFloat16Tensor is HostTensor(bits, BFloat16, shape...): bits holds bfloat16 values' bit
// patterns.
func BFloat16Tensor(bits []uint16, shape ...int) *Tensor { return HostTensor(bits, BFloat16, shape...) }

// Float16Tensor is HostTensor(bits, Float16, shape...): bits holds IEEE float16 values' bit
// patterns.
func Float16Tensor(bits []uint16, shape ...int) *Tensor { return HostTensor(bits, Float16, shape...) }

// NewTensor is HostTensor that reports a bad description at once instead of at the call using
// the tensor.
func NewTensor[T Element](data []T, dtype DType, shape ...int) (*Tensor, error) {
	var zero T
	if !holds(unsafe.Sizeof(zero), dtype) {
		return nil, goError(BadTensor, "a %T slice cannot hold %v elements", data, dtype)
	}
	dt, err := dlpackOf(dtype)
	if err != nil {
		return nil, err
	}
	return hostTensor(slicePtr(data), data, len(data), dt, shape, nil)
}

// NewStridedTensor describes a strided view of data (element strides, innermost 1); every element
// reached must lie inside data.
func NewStridedTensor[T Element](data []T, dtype DType, shape, strides []int) (*Tensor, error) {
	var zero T
	if !holds(unsafe.Sizeof(zero), dtype) {
		return nil, goError(BadTensor, "a %T slice cannot hold %v elements", data, dtype)
	}
	dt, err := dlpackOf(dtype)
	if err != nil {
		return nil, err
	}
	if strides == nil {
		strides = []int{}
	}
	return hostTensor(slicePtr(data), data, len(data), dt, shape, strides)
}

// Int64Tensor describes a 1-D int64 tensor (a slot mapping).
func Int64Tensor(data []int64) *Tensor {
	t, _ := hostTensor(slicePtr(data), data, len(data), DLInt64, []int{len(data)}, nil)
	return t
}

// Int32Tensor describes a 1-D int32 tensor (a slot mapping).
func Int32Tensor(data []int32) *Tensor {
	t, _ := hostTensor(slicePtr(data), data, len(data), DLInt32, []int{len(data)}, nil)
	return t
}

// TensorFromPointer describes memory the Go runtime does not manage, e.g. on a GPU or from
// C.malloc. strides are in elements (nil = compact). The caller guarantees that ptr addresses
// every element the view reaches on device, for as long as calls (and, on GPUs, queued work) use
// it.
func TensorFromPointer(ptr unsafe.Pointer, device Device, dtype DataType, shape, strides []int64, byteOffset uint64) (*Tensor, error) {
	if len(shape) > maxDims || (strides != nil && len(strides) != len(shape)) {
		return nil, goError(BadTensor, "shape %v with strides %v", shape, strides)
	}
	return &Tensor{data: ptr, device: device, dtype: dtype, shape: append([]int64(nil), shape...),
		strides: append([]int64(nil), strides...), byteOffset: byteOffset}, nil
}

// Shape returns the tensor's shape.
func (t *Tensor) Shape() []int64 { return append([]int64(nil), t.shape...) }

// DType returns the tensor's DLPack element type.
func (t *Tensor) DType() DataType { return t.dtype }

// Device returns where the tensor's data lives.
func (t *Tensor) Device() Device { return t.device }

// checkTensors returns the construction error of the first refused tensor, or an error for one
// with more dimensions than the C shim carries; nil tensors are left to the library.
func checkTensors(ts ...*Tensor) error {
	for _, t := range ts {
		if t == nil {
			continue
		}
		if t.err != nil {
			return t.err
		}
		if len(t.shape) > maxDims {
			return goError(BadTensor, "%d dimensions (at most %d)", len(t.shape), maxDims)
		}
	}
	return nil
}

func keepAlive(ts ...*Tensor) {
	for _, t := range ts {
		if t != nil {
			runtime.KeepAlive(t.keep)
		}
	}
}
