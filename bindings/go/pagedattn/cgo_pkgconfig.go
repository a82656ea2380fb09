//go:build !pagedattn_nopkgconfig && !pagedattn_static
// +build !pagedattn_nopkgconfig,!pagedattn_static

package pagedattn

// The headers and the library come from `pkg-config pagedattn` (PKG_CONFIG_PATH applies; cgo
// runs pkg-config in this package's directory, so give it absolute paths). The file's Libs carry
// a run path to the library's directory (except for a /usr install), so the program starts
// without LD_LIBRARY_PATH.

// #cgo pkg-config: pagedattn
import "C"
