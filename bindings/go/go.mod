module github.com/pagedattn/pagedattn/bindings/go

go 1.19
