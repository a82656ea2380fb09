/* lib/status.cpp — status names, the thread-local last-error message, versions, dtype helpers
 * (names, sizes, DLPack mapping) and the error-formatting helpers of internal.h. */
#include <cstdio>

#include "internal.h"

namespace pa {

namespace {
/* Large enough for a backend message (PA_MSG_LEN) plus our prefix and a plugin search list. */
constexpr size_t kMsgCap = 2048;
thread_local char tl_msg[kMsgCap];
}  // namespace

void set_last_error(const char* msg) noexcept {
  if (!msg) msg = "";
  size_t n = std::strlen(msg);
  if (n >= kMsgCap) n = kMsgCap - 1;
  std::memcpy(tl_msg, msg, n);
  tl_msg[n] = '\0';
}

void clear_last_error() noexcept { tl_msg[0] = '\0'; }

std::string vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  char small[256];
  int n = std::vsnprintf(small, sizeof small, fmt, ap2);
  va_end(ap2);
  if (n < 0) return std::string(fmt);
  if (static_cast<size_t>(n) < sizeof small) return std::string(small, static_cast<size_t>(n));
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(&out[0], out.size(), fmt, ap);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

void fail(pagedattn_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  throw Error{status, std::move(s)};
}

void check_op(pagedattn_status st, const char* backend, const char* op, const char* msg) {
  if (st == PAGEDATTN_OK) return;
  if (msg && msg[0]) {
    const size_t n = std::strlen(backend);
    /* Backends may already name themselves; do not say it twice. */
    if (std::strncmp(msg, backend, n) == 0 && msg[n] == ':') fail(st, "%s", msg);
    fail(st, "%s: %s", backend, msg);
  }
  fail(st, "%s: %s failed with %s", backend, op, pagedattn_status_string(st));
}

void check_struct_size(uint32_t size, size_t first, size_t current, const char* name) {
  if (size < first)
    fail(PAGEDATTN_ERROR_STRUCT_SIZE, "%s->struct_size = %u < minimum %zu", name, size, first);
  /* Only a published layout: a size between two would cut a later field (a pointer) short. */
  if (size != first && size != current) {
    if (first == current)
      fail(PAGEDATTN_ERROR_STRUCT_SIZE,
           "%s->struct_size = %u is not a known size (this library knows %zu)", name, size,
           current);
    fail(PAGEDATTN_ERROR_STRUCT_SIZE,
         "%s->struct_size = %u is not a known size (this library knows %zu, the 0.1 layout, and "
         "%zu)",
         name, size, first, current);
  }
}

const char* dtype_name(pagedattn_dtype dt) noexcept {
  switch (raw_enum(dt)) {
    case PAGEDATTN_DTYPE_FLOAT32: return "float32";
    case PAGEDATTN_DTYPE_FLOAT16: return "float16";
    case PAGEDATTN_DTYPE_BFLOAT16: return "bfloat16";
    case PAGEDATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case PAGEDATTN_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "invalid";
  }
}

size_t dtype_size(pagedattn_dtype dt) noexcept {
  switch (raw_enum(dt)) {
    case PAGEDATTN_DTYPE_FLOAT32: return 4;
    case PAGEDATTN_DTYPE_FLOAT16:
    case PAGEDATTN_DTYPE_BFLOAT16: return 2;
    case PAGEDATTN_DTYPE_FP8_E4M3:
    case PAGEDATTN_DTYPE_FP8_E5M2: return 1;
    default: return 0;
  }
}

bool dtype_valid(int32_t dt) noexcept {
  return dt >= PAGEDATTN_DTYPE_FLOAT32 && dt <= PAGEDATTN_DTYPE_FP8_E5M2;
}

std::string dtype_mask_names(uint32_t mask) {
  std::string s;
  for (int32_t dt = PAGEDATTN_DTYPE_FLOAT32; dt <= PAGEDATTN_DTYPE_FP8_E5M2; ++dt) {
    if (!(mask & PAGEDATTN_DTYPE_BIT(dt))) continue;
    if (!s.empty()) s += ", ";
    s += dtype_name(static_cast<pagedattn_dtype>(dt));
  }
  return s.empty() ? std::string("none") : s;
}

}  // namespace pa

extern "C" {

PAGEDATTN_API const char* pagedattn_status_string(pagedattn_status status) {
  switch (pa::raw_enum(status)) {
    case PAGEDATTN_OK: return "PAGEDATTN_OK";
    case PAGEDATTN_ERROR_INVALID_ARGUMENT: return "PAGEDATTN_ERROR_INVALID_ARGUMENT";
    case PAGEDATTN_ERROR_NULL_POINTER: return "PAGEDATTN_ERROR_NULL_POINTER";
    case PAGEDATTN_ERROR_STRUCT_SIZE: return "PAGEDATTN_ERROR_STRUCT_SIZE";
    case PAGEDATTN_ERROR_BAD_TENSOR: return "PAGEDATTN_ERROR_BAD_TENSOR";
    case PAGEDATTN_ERROR_WRONG_DEVICE: return "PAGEDATTN_ERROR_WRONG_DEVICE";
    case PAGEDATTN_ERROR_OUT_OF_RANGE: return "PAGEDATTN_ERROR_OUT_OF_RANGE";
    case PAGEDATTN_ERROR_OVERFLOW: return "PAGEDATTN_ERROR_OVERFLOW";
    case PAGEDATTN_ERROR_UNSUPPORTED: return "PAGEDATTN_ERROR_UNSUPPORTED";
    case PAGEDATTN_ERROR_CAPACITY: return "PAGEDATTN_ERROR_CAPACITY";
    case PAGEDATTN_ERROR_OUT_OF_MEMORY: return "PAGEDATTN_ERROR_OUT_OF_MEMORY";
    case PAGEDATTN_ERROR_UNKNOWN_BACKEND: return "PAGEDATTN_ERROR_UNKNOWN_BACKEND";
    case PAGEDATTN_ERROR_BACKEND_UNAVAILABLE: return "PAGEDATTN_ERROR_BACKEND_UNAVAILABLE";
    case PAGEDATTN_ERROR_PLUGIN: return "PAGEDATTN_ERROR_PLUGIN";
    case PAGEDATTN_ERROR_PLUGIN_ABI: return "PAGEDATTN_ERROR_PLUGIN_ABI";
    case PAGEDATTN_ERROR_DEVICE: return "PAGEDATTN_ERROR_DEVICE";
    case PAGEDATTN_ERROR_INVALID_HANDLE: return "PAGEDATTN_ERROR_INVALID_HANDLE";
    case PAGEDATTN_ERROR_INTERNAL: return "PAGEDATTN_ERROR_INTERNAL";
  }
  return "PAGEDATTN_STATUS_UNKNOWN";
}

PAGEDATTN_API const char* pagedattn_last_error(void) { return pa::tl_msg; }

PAGEDATTN_API int32_t pagedattn_version(int32_t* major, int32_t* minor, int32_t* patch) {
  if (major) *major = PAGEDATTN_VERSION_MAJOR;
  if (minor) *minor = PAGEDATTN_VERSION_MINOR;
  if (patch) *patch = PAGEDATTN_VERSION_PATCH;
  return PAGEDATTN_VERSION_NUMBER;
}

PAGEDATTN_API const char* pagedattn_version_string(void) { return PAGEDATTN_VERSION_STRING; }

PAGEDATTN_API const char* pagedattn_dtype_name(pagedattn_dtype dtype) {
  return pa::dtype_name(dtype);
}

PAGEDATTN_API size_t pagedattn_dtype_size(pagedattn_dtype dtype) { return pa::dtype_size(dtype); }

PAGEDATTN_API pagedattn_status pagedattn_dtype_to_dlpack(pagedattn_dlpack_dtype* out,
                                                        pagedattn_dtype dtype) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    pagedattn_dlpack_dtype d{};
    d.lanes = 1;
    switch (pa::raw_enum(dtype)) {
      case PAGEDATTN_DTYPE_FLOAT32: d.code = PAGEDATTN_DLPACK_FLOAT; d.bits = 32; break;
      case PAGEDATTN_DTYPE_FLOAT16: d.code = PAGEDATTN_DLPACK_FLOAT; d.bits = 16; break;
      case PAGEDATTN_DTYPE_BFLOAT16: d.code = PAGEDATTN_DLPACK_BFLOAT; d.bits = 16; break;
      case PAGEDATTN_DTYPE_FP8_E4M3: d.code = PAGEDATTN_DLPACK_FLOAT8_E4M3FN; d.bits = 8; break;
      case PAGEDATTN_DTYPE_FP8_E5M2: d.code = PAGEDATTN_DLPACK_FLOAT8_E5M2; d.bits = 8; break;
      default:
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "dtype = %d is not a valid pagedattn_dtype",
                 pa::raw_enum(dtype));
    }
    *out = d;
  });
}

PAGEDATTN_API pagedattn_status pagedattn_dtype_from_dlpack(pagedattn_dtype* out,
                                                          pagedattn_dlpack_dtype dtype) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    pagedattn_dtype r = PAGEDATTN_DTYPE_INVALID;
    if (dtype.lanes == 1) {
      if (dtype.code == PAGEDATTN_DLPACK_FLOAT && dtype.bits == 32) r = PAGEDATTN_DTYPE_FLOAT32;
      if (dtype.code == PAGEDATTN_DLPACK_FLOAT && dtype.bits == 16) r = PAGEDATTN_DTYPE_FLOAT16;
      if (dtype.code == PAGEDATTN_DLPACK_BFLOAT && dtype.bits == 16) r = PAGEDATTN_DTYPE_BFLOAT16;
      if (dtype.code == PAGEDATTN_DLPACK_FLOAT8_E4M3FN && dtype.bits == 8)
        r = PAGEDATTN_DTYPE_FP8_E4M3;
      if (dtype.code == PAGEDATTN_DLPACK_FLOAT8_E5M2 && dtype.bits == 8)
        r = PAGEDATTN_DTYPE_FP8_E5M2;
    }
    if (r == PAGEDATTN_DTYPE_INVALID)
      pa::fail(PAGEDATTN_ERROR_UNSUPPORTED,
               "DLPack dtype {code %u, bits %u, lanes %u} is not supported (float32, float16, "
               "bfloat16, float8_e4m3fn, float8_e5m2 with lanes 1)",
               dtype.code, dtype.bits, dtype.lanes);
    *out = r;
  });
}

}  // extern "C"
