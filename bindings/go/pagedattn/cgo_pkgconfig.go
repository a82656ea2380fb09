//go:build !pagedattn_nopkgconfig
// +build !pagedattn_nopkgconfig

package pagedattn

// The headers and the library come from `pkg-config pagedattn` (PKG_CONFIG_PATH applies; cgo
// runs pkg-config in this package's directory, so give it absolute paths).

// #cgo pkg-config: pagedattn
import "C"
