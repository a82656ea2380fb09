/* lib/internal.h — shared internals of the core: the error machinery (an exception carrying a
 * status and message, turned into a return code by guard() at every C entry point), struct-size
 * helpers and small string helpers. */
#ifndef PAGEDATTN_LIB_INTERNAL_H
#define PAGEDATTN_LIB_INTERNAL_H

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "plugin_abi.h"

namespace pa {

/* Thrown inside the library only; guard() converts it to a status at the boundary. */
struct Error {
  pagedattn_status status;
  std::string msg;
};

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vformat(const char* fmt, va_list ap);

[[noreturn]] void fail(pagedattn_status status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last-error message. */
void set_last_error(const char* msg) noexcept;
void clear_last_error() noexcept;

/* The message logging of log.cpp: log() formats and sends a message to the application's
 * callback when one is set for `level` (cheap otherwise: one atomic load); log_enabled says
 * whether it would, for messages costly to compose. Never throws. */
bool log_enabled(pagedattn_log_level level) noexcept;
void log(pagedattn_log_level level, const char* fmt, ...) noexcept
    __attribute__((format(printf, 2, 3)));

/* A failed call's end: sets the thread's message and logs it at PAGEDATTN_LOG_ERROR. */
pagedattn_status failed(pagedattn_status status, const char* msg) noexcept;

/* Runs f, maps every exception to a status, and sets (or clears) the thread's message. */
template <class F>
pagedattn_status guard(F&& f) noexcept {
  try {
    f();
    clear_last_error();
    return PAGEDATTN_OK;
  } catch (const Error& e) {
    return failed(e.status, e.msg.c_str());
  } catch (const std::bad_alloc&) {
    return failed(PAGEDATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::length_error&) {
    return failed(PAGEDATTN_ERROR_OUT_OF_MEMORY, "out of host memory (allocation size too large)");
  } catch (const std::exception& e) {
    return failed(PAGEDATTN_ERROR_INTERNAL, e.what());
  } catch (...) {
    return failed(PAGEDATTN_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

/* Raises the status a backend op returned, prefixing its message with the backend's name. */
void check_op(pagedattn_status st, const char* backend, const char* op, const char* msg);

/* Known struct sizes: the first published layout (first_size) and this library's sizeof, and
 * nothing between (a size cutting a field short would read part of it); a size larger than this
 * library knows (a newer caller's fields it cannot honour) is refused too. */
void check_struct_size(uint32_t size, size_t first, size_t current, const char* name);

/* The size of a struct's first published layout: sizeof for a struct that has not grown. */
template <class T>
constexpr size_t first_size() {
  return sizeof(T);
}
template <>
constexpr size_t first_size<pagedattn_capabilities>() {
  return offsetof(pagedattn_capabilities, target); /* 0.1 */
}
template <>
constexpr size_t first_size<pagedattn_batch_desc>() {
  return offsetof(pagedattn_batch_desc, lens_form); /* 0.1 */
}
template <>
constexpr size_t first_size<pagedattn_attention_options>() {
  return offsetof(pagedattn_attention_options, sinks); /* 0.1 */
}
template <>
constexpr size_t first_size<pagedattn_batch_info>() {
  return offsetof(pagedattn_batch_info, host_bytes); /* 0.1 */
}

/* Reads an input struct that starts with uint32 struct_size and copies min(struct_size, sizeof)
 * bytes over zeros, so once a struct grows, an older caller's shorter struct reads as if the new
 * fields were zero. */
template <class T>
T read_struct(const T* p, const char* name) {
  if (!p) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  uint32_t size;
  std::memcpy(&size, p, sizeof size);
  check_struct_size(size, first_size<T>(), sizeof(T), name);
  T out;
  std::memset(&out, 0, sizeof out);
  std::memcpy(&out, p, size < sizeof(T) ? size : sizeof(T));
  return out;
}

/* Checks an output struct's struct_size (same rule as read_struct). */
template <class T>
void check_out_struct(const T* p, const char* name) {
  if (!p) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  uint32_t size;
  std::memcpy(&size, p, sizeof size);
  check_struct_size(size, first_size<T>(), sizeof(T), name);
}

/* Writes `value` into an output struct: min(struct_size, sizeof) bytes, keeping the caller's
 * struct_size. */
template <class T>
void write_struct(T* p, const T& value) {
  uint32_t size;
  std::memcpy(&size, p, sizeof size);
  T tmp = value;
  std::memcpy(&tmp, &size, sizeof size);
  std::memcpy(p, &tmp, size < sizeof(T) ? size : sizeof(T));
}

/* The integer a caller stored in an enum-typed field: C callers may put any int there, and
 * loading an out-of-range value as the C++ enum type is undefined behaviour. */
template <class E>
int32_t raw_enum(const E& e) noexcept {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums are int-sized here");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

const char* dtype_name(pagedattn_dtype dt) noexcept;
size_t dtype_size(pagedattn_dtype dt) noexcept;
bool dtype_valid(int32_t dt) noexcept;
/* "float32, float16" for a capability mask. */
std::string dtype_mask_names(uint32_t mask);

}  // namespace pa

#endif /* PAGEDATTN_LIB_INTERNAL_H */
