// Package pagedattn drives libpagedattn, attention for LLM serving over a paged KV cache,
// through cgo.
//
// Import it as github.com/pagedattn/pagedattn/bindings/go/pagedattn (module
// github.com/pagedattn/pagedattn/bindings/go); outside this repository, point a replace
// directive at a local checkout (see README.md beside go.mod).
//
// A Backend creates KVCaches and plans Batches; Backend.Forward runs one layer of attention
// (its arguments in a ForwardArgs), Backend.ForwardMLA multi-head latent attention over a latent
// cache (CacheLatent: DeepSeek V2/V3, Kimi K2) and Backend.MergeStates combines partial results.
// Every handle has Close (a second Close, or any use after Close, returns an *Error instead of
// crashing) and a finalizer as a safety net. Every failure is an *Error carrying the library's
// status code and message. Host tensors are Go slices wrapped by Float32Tensor, BFloat16Tensor,
// Float16Tensor or HostTensor, which defer a bad description's error to the call that uses the
// tensor (NewTensor reports it at once); device memory goes through TensorFromPointer.
//
// Backend.Capabilities names the code path a backend runs (Target) and the choices and
// environment variables behind it (Settings); Backend.MemoryUsage and BatchInfo count the bytes
// held; SetLogCallback sends the library's messages (failed calls, backends, caches, batches)
// to a Go func.
//
// The library is found through pkg-config (module "pagedattn"); from a Meson build tree set
// PKG_CONFIG_PATH=<builddir>/meson-uninstalled (an absolute path). The program links
// libpagedattn.so with a run path to it from the .pc file; with the tag pagedattn_static it
// links libpagedattn.a instead (module "pagedattn-static") and needs no run path. Building with
// the tag pagedattn_nopkgconfig skips pkg-config: CGO_CFLAGS and CGO_LDFLAGS then say where the
// headers and library are.
package pagedattn

import (
	"fmt"
	"unsafe"
)

// Code is a pagedattn_status value (pinned forever by the C ABI).
type Code int

// Status codes of the C library.
const (
	OK                 Code = 0
	InvalidArgument    Code = 1
	NullPointer        Code = 2
	StructSize         Code = 3
	BadTensor          Code = 4
	WrongDevice        Code = 5
	OutOfRange         Code = 6
	Overflow           Code = 7
	Unsupported        Code = 8
	Capacity           Code = 9
	OutOfMemory        Code = 10
	UnknownBackend     Code = 11
	BackendUnavailable Code = 12
	Plugin             Code = 13
	PluginABI          Code = 14
	DeviceError        Code = 15
	InvalidHandle      Code = 16
	Internal           Code = 17
)

// String returns the C constant's name, e.g. "PAGEDATTN_ERROR_BAD_TENSOR".
func (c Code) String() string { return cStatusString(c) }

// Error is a failed call: the status code and the library's message, captured inside the same C
// call as the failure. Checks this package makes itself (slice lengths, closed handles) use the
// same codes and say "pagedattn (Go)" in the message.
type Error struct {
	Code Code
	Msg  string
}

// Error formats the code's name and the message.
func (e *Error) Error() string { return e.Code.String() + ": " + e.Msg }

// Is reports whether target is an *Error with the same code, so errors.Is(err,
// &pagedattn.Error{Code: pagedattn.OutOfRange}) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

func goError(code Code, format string, args ...interface{}) error {
	return &Error{Code: code, Msg: "pagedattn (Go): " + fmt.Sprintf(format, args...)}
}

// Version is a library version.
type Version struct {
	Major, Minor, Patch int
}

// String formats "major.minor.patch".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// LibraryVersion returns the version of the library loaded at run time.
func LibraryVersion() Version {
	ma, mi, pa := cVersion()
	return Version{ma, mi, pa}
}

// LibraryVersionString returns the run-time library's version string, e.g. "0.2.0".
func LibraryVersionString() string { return cVersionString() }

// HeaderVersion is the version of the headers this package was compiled against; its Major must
// equal LibraryVersion().Major.
var HeaderVersion = Version{headerMajor, headerMinor, headerPatch}

// DType is an element type of caches (and, as DLPack types, of tensors).
type DType int

// Element types.
const (
	Float32  DType = 1
	Float16  DType = 2
	BFloat16 DType = 3
	FP8E4M3  DType = 4 // cache only; finite, max 448
	FP8E5M2  DType = 5 // cache only
)

// String returns the library's name for the dtype ("float32", "fp8_e4m3"...).
func (d DType) String() string { return cDTypeName(d) }

// Size returns bytes per element (0 for an invalid dtype).
func (d DType) Size() int { return cDTypeSize(d) }

// Bit returns the dtype's bit in capability masks.
func (d DType) Bit() uint32 { return 1 << uint(d) }

// DLPack returns the DLPack type of tensors of this dtype.
func (d DType) DLPack() (DataType, error) { return cDTypeToDLPack(d) }

// DTypeFromDLPack maps a DLPack type to a dtype (Unsupported for types pagedattn has no use for).
func DTypeFromDLPack(t DataType) (DType, error) { return cDTypeFromDLPack(t) }

// DataType is a DLPack element type.
type DataType struct {
	Code  uint8 // DLPack code: int 0, uint 1, float 2, bfloat 4, fp8 10 / 12
	Bits  uint8
	Lanes uint16
}

// DLPack element types used by pagedattn.
var (
	DLFloat32  = DataType{2, 32, 1}
	DLFloat16  = DataType{2, 16, 1}
	DLBFloat16 = DataType{4, 16, 1}
	DLInt32    = DataType{0, 32, 1}
	DLInt64    = DataType{0, 64, 1}
)

func dlpackOf(d DType) (DataType, error) {
	switch d {
	case Float32:
		return DLFloat32, nil
	case Float16:
		return DLFloat16, nil
	case BFloat16:
		return DLBFloat16, nil
	}
	return d.DLPack()
}

// DeviceType is a DLPack device code.
type DeviceType int

// Device types.
const (
	CPU      DeviceType = 1
	CUDA     DeviceType = 2
	CUDAHost DeviceType = 3
	ROCm     DeviceType = 10
	ROCmHost DeviceType = 11
)

// Device says where memory lives.
type Device struct {
	Type DeviceType
	ID   int
}

// HostDevice is host memory.
var HostDevice = Device{CPU, 0}

// callConfig holds the per-call settings of CallOptions.
type callConfig struct {
	stream unsafe.Pointer
}

// CallOption adjusts one call.
type CallOption func(*callConfig)

// OnStream queues the call's work on a CUDA/HIP stream (cudaStream_t / hipStream_t) instead of
// the default stream. CPU backends ignore it.
func OnStream(stream unsafe.Pointer) CallOption {
	return func(c *callConfig) { c.stream = stream }
}

func configure(opts []CallOption) callConfig {
	var c callConfig
	for _, o := range opts {
		o(&c)
	}
	return c
}
