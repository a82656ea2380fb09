package pagedattn

// The library's log messages, delivered to a Go func. The C side (the trampoline the library
// calls and the setter) lives in capi.go; this file holds the exported Go entry point, which cgo
// allows only in a file whose preamble declares and defines nothing.

// #include <stdint.h>
import "C"

import (
	"runtime/cgo"
	"strconv"
)

// LogLevel is the severity of a log message, most severe first: a callback set for a level
// receives the messages of that level and of the more severe ones.
type LogLevel int

// Log levels (pagedattn_log_level).
const (
	LogError LogLevel = 0 // a call failed: "<status name>: <the error's message>"
	LogInfo  LogLevel = 1 // a backend was created (name and settings); what "auto" picked
	LogDebug LogLevel = 2 // a cache or batch was created or destroyed, with its sizes in bytes
)

// String returns "ERROR", "INFO" or "DEBUG" (or the number for an unknown level).
func (l LogLevel) String() string {
	switch l {
	case LogError:
		return "ERROR"
	case LogInfo:
		return "INFO"
	case LogDebug:
		return "DEBUG"
	}
	return "LogLevel(" + strconv.Itoa(int(l)) + ")"
}

// SetLogCallback sends the library's messages at level and above to fn, process-wide,
// replacing any earlier callback; a nil fn stops logging (the default).
//
// fn runs synchronously on the goroutine whose call is being logged, possibly on several
// goroutines at once, so it must be safe for concurrent use; msg is one line without a newline.
// pagedattn calls made from inside fn are not logged, and SetLogCallback from inside fn fails
// with InvalidArgument. A panic in fn is recovered and dropped, since it must not unwind through
// the C library; fn must not call runtime.Goexit (t.FailNow, t.Fatal) either. Once
// SetLogCallback returns, the previous fn is not running and is not called again.
//
// A level outside int32 is refused with Overflow, one that is not a LogLevel with
// InvalidArgument; on error the earlier callback stays.
func SetLogCallback(fn func(level LogLevel, msg string), level LogLevel) error {
	return cSetLogCallback(fn, level)
}

// goPagedattnLog is called by the C trampoline with the cgo.Handle of the current func.
//
//export goPagedattnLog
func goPagedattnLog(handle C.uintptr_t, level C.int, message *C.char) {
	// A panic unwinding into C++ would skip the library's unlock: drop it here.
	defer func() { _ = recover() }()
	fn, ok := cgo.Handle(handle).Value().(func(level LogLevel, msg string))
	if ok && fn != nil {
		fn(LogLevel(level), C.GoString(message))
	}
}
