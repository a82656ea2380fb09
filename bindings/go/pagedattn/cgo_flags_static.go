//go:build pagedattn_nopkgconfig && pagedattn_static
// +build pagedattn_nopkgconfig,pagedattn_static

package pagedattn

// Built with -tags pagedattn_nopkgconfig,pagedattn_static: libpagedattn.a is linked into the
// program by name (-l:, so that the .so beside it is not picked), then what the archive needs, as
// pagedattn-static.pc lists it. Its headers and directory come from the environment, e.g.
// CGO_CFLAGS=-I<prefix>/include CGO_LDFLAGS=-L<prefix>/lib.

// #cgo LDFLAGS: -l:libpagedattn.a -lhwy -lstdc++ -lm -ldl -lpthread
import "C"
