module github.com/pagedattn/pagedattn/examples/go

go 1.19

require github.com/pagedattn/pagedattn/bindings/go v0.0.0

replace github.com/pagedattn/pagedattn/bindings/go => ../../bindings/go
