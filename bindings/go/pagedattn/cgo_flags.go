//go:build pagedattn_nopkgconfig && !pagedattn_static
// +build pagedattn_nopkgconfig,!pagedattn_static

package pagedattn

// Built with -tags pagedattn_nopkgconfig: no pkg-config. The library is linked by name; its
// headers and directory come from the environment, e.g.
// CGO_CFLAGS=-I<prefix>/include CGO_LDFLAGS="-L<prefix>/lib -Wl,-rpath,<prefix>/lib".

// #cgo LDFLAGS: -lpagedattn
import "C"
