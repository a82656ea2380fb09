//go:build pagedattn_static && !pagedattn_nopkgconfig
// +build pagedattn_static,!pagedattn_nopkgconfig

package pagedattn

// Built with -tags pagedattn_static: libpagedattn.a (core and cpu backend) is linked into the
// program, which then needs no run path; the plugin backends are still loaded at run time. The
// headers, the archive and the libraries it needs come from `pkg-config pagedattn-static`.

// #cgo pkg-config: pagedattn-static
import "C"
