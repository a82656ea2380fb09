/* pagedattn/common.h — export macro, status codes, errors, versions, element types.
 *
 * Conventions used by every header of pagedattn:
 *  - Every fallible function returns a pagedattn_status. PAGEDATTN_OK is 0; every other value is
 *    an error whose numeric value is pinned forever.
 *  - On failure, out-parameters and caller memory are left untouched, and a message naming the
 *    offending argument and value is stored for the calling thread (pagedattn_last_error()).
 *  - Out-parameters come first. *_destroy(NULL) is a no-op.
 *  - Option/description structs start with `struct_size` (set it to sizeof(the struct), or use
 *    the matching *_init function) so they can grow without breaking callers built against an
 *    older header.
 *  - No C++ exception, abort() or exit() crosses this boundary.
 */
#ifndef PAGEDATTN_COMMON_H
#define PAGEDATTN_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "pagedattn/version.h"

#if defined(_WIN32)
#  if defined(PAGEDATTN_BUILDING_LIBRARY)
#    define PAGEDATTN_API __declspec(dllexport)
#  else
#    define PAGEDATTN_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define PAGEDATTN_API __attribute__((visibility("default")))
#else
#  define PAGEDATTN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Values are part of the ABI and never change meaning.
 *
 * Each function's comment lists the statuses its own checks return. In addition, any function
 * that returns a pagedattn_status may return, from any call:
 *  - PAGEDATTN_ERROR_OUT_OF_MEMORY when a host allocation inside the library fails (every entry
 *    point catches std::bad_alloc at the boundary and reports it this way), and, on GPU
 *    backends, when the device runtime reports an out-of-memory error for queued work (rather
 *    than PAGEDATTN_ERROR_DEVICE);
 *  - PAGEDATTN_ERROR_INTERNAL for any other unexpected failure inside the library or a backend
 *    (every other exception is caught at the boundary too): a bug; please report the message.
 * Functions that return something other than a pagedattn_status cannot fail. */
typedef enum pagedattn_status {
  PAGEDATTN_OK = 0,
  /* A value is outside what the call accepts (negative length, H % Hkv != 0, bad enum...). */
  PAGEDATTN_ERROR_INVALID_ARGUMENT = 1,
  /* A required handle or pointer is NULL. */
  PAGEDATTN_ERROR_NULL_POINTER = 2,
  /* An option struct's struct_size is smaller than the oldest layout or not a known size. */
  PAGEDATTN_ERROR_STRUCT_SIZE = 3,
  /* A tensor has the wrong rank, shape, dtype, or a non-unit innermost stride. */
  PAGEDATTN_ERROR_BAD_TENSOR = 4,
  /* A tensor (or cache) lives on a device the backend cannot use for this call. */
  PAGEDATTN_ERROR_WRONG_DEVICE = 5,
  /* A block id, slot, layer index or pair lies outside the cache. */
  PAGEDATTN_ERROR_OUT_OF_RANGE = 6,
  /* Sizes whose product or sum overflows the index types. */
  PAGEDATTN_ERROR_OVERFLOW = 7,
  /* The backend does not implement this head size, block size, dtype or feature. */
  PAGEDATTN_ERROR_UNSUPPORTED = 8,
  /* A batch update needs more sequences, tokens or table width than the batch was planned for. */
  PAGEDATTN_ERROR_CAPACITY = 9,
  /* Host or device memory could not be allocated (or the backend's memory limit was hit). */
  PAGEDATTN_ERROR_OUT_OF_MEMORY = 10,
  /* No backend of that name exists. */
  PAGEDATTN_ERROR_UNKNOWN_BACKEND = 11,
  /* The backend exists but cannot run here (no device, no driver); the message says why. */
  PAGEDATTN_ERROR_BACKEND_UNAVAILABLE = 12,
  /* A plugin file is missing, fails to load, is not a pagedattn plugin, or fails its init. */
  PAGEDATTN_ERROR_PLUGIN = 13,
  /* A plugin was built for another plugin ABI version. */
  PAGEDATTN_ERROR_PLUGIN_ABI = 14,
  /* The device runtime reported an error (launch failure, illegal address...). */
  PAGEDATTN_ERROR_DEVICE = 15,
  /* A handle was already destroyed, is of the wrong kind, or belongs to another backend. */
  PAGEDATTN_ERROR_INVALID_HANDLE = 16,
  /* A bug in pagedattn; please report it with the message. */
  PAGEDATTN_ERROR_INTERNAL = 17
} pagedattn_status;

/* Returns the constant name of a status ("PAGEDATTN_ERROR_BAD_TENSOR"), or
 * "PAGEDATTN_STATUS_UNKNOWN" for a value that is not a status. Never NULL; the string is static.
 * Thread-safe. */
PAGEDATTN_API const char* pagedattn_status_string(pagedattn_status status);

/* Returns the message of the last call on this thread that failed: what was wrong and why
 * (e.g. "block_tables[3][17] = 9000 >= num_blocks 4096"). Every fallible call that succeeds resets
 * it to "". Never NULL. The string is owned by the library and stays valid until the next
 * pagedattn call on the same thread. Thread-safe (the message is thread-local). */
PAGEDATTN_API const char* pagedattn_last_error(void);

/* Log levels, most severe first; a callback receives every message at or above its level. */
typedef enum pagedattn_log_level {
  PAGEDATTN_LOG_ERROR = 0, /* a call failed: "<status name>: <the message of pagedattn_last_error>" */
  PAGEDATTN_LOG_INFO = 1,  /* a backend was created: its name and settings (see capabilities);
                              what "auto" picked and why each better candidate was passed over */
  PAGEDATTN_LOG_DEBUG = 2  /* a cache or batch was created or destroyed, with its sizes in bytes */
} pagedattn_log_level;

/* A log sink: `message` is one line without a newline, valid only during the call. */
typedef void (*pagedattn_log_fn)(void* user_data, pagedattn_log_level level, const char* message);

/* Sends the library's messages at `max_level` and above to `fn` (NULL: no logging, the
 * default), process-wide, replacing any earlier callback. The callback runs synchronously on the
 * thread that made the call being logged (never on a worker thread), possibly on many threads at
 * once, so it must be thread-safe; pagedattn calls made from inside it are not logged. Once this
 * function returns, the previous callback is not running and is not called again. Returns
 * PAGEDATTN_ERROR_INVALID_ARGUMENT (max_level not a pagedattn_log_level; called from inside the
 * callback), and then keeps the earlier callback. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_set_log_callback(pagedattn_log_fn fn, void* user_data,
                                                         pagedattn_log_level max_level);

/* Returns the library's version as PAGEDATTN_VERSION_NUMBER would (major*10000+minor*100+patch)
 * and, when the pointers are non-NULL, its parts. A caller should check that the major version
 * equals the PAGEDATTN_VERSION_MAJOR it was compiled against. Thread-safe; cannot fail. */
PAGEDATTN_API int32_t pagedattn_version(int32_t* major, int32_t* minor, int32_t* patch);

/* Returns the library's version string ("0.1.0"). Static; thread-safe. */
PAGEDATTN_API const char* pagedattn_version_string(void);

/* Element types of KV caches (and the short names used in capability masks). Tensors at the
 * boundary carry DLPack dtypes instead (see tensor.h); pagedattn_dtype_to_dlpack maps between. */
typedef enum pagedattn_dtype {
  PAGEDATTN_DTYPE_INVALID = 0,
  PAGEDATTN_DTYPE_FLOAT32 = 1,
  PAGEDATTN_DTYPE_FLOAT16 = 2,
  PAGEDATTN_DTYPE_BFLOAT16 = 3,
  /* fp8 with 4 exponent bits, finite only (max 448): OCP "e4m3fn". Cache only. */
  PAGEDATTN_DTYPE_FP8_E4M3 = 4,
  /* fp8 with 5 exponent bits (max 57344). Cache only. */
  PAGEDATTN_DTYPE_FP8_E5M2 = 5
} pagedattn_dtype;

/* Bit for a dtype in capability masks. */
#define PAGEDATTN_DTYPE_BIT(dt) (1u << (unsigned)(dt))

/* Returns the dtype's name ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"), or
 * "invalid" for any other value. Never NULL; static; thread-safe; cannot fail. */
PAGEDATTN_API const char* pagedattn_dtype_name(pagedattn_dtype dtype);

/* Returns the size of one element in bytes (4, 2, 2, 1, 1), or 0 for an invalid dtype.
 * Thread-safe; cannot fail. */
PAGEDATTN_API size_t pagedattn_dtype_size(pagedattn_dtype dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_COMMON_H */
