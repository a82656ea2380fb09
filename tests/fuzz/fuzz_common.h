/* Shared helpers of the fuzz targets: an input reader, guarded buffers (canaries around every
 * buffer, poisoned for ASan when it is on) and checks that abort with a message, so libFuzzer
 * records the input as a crash. */
#ifndef PAGEDATTN_FUZZ_COMMON_H
#define PAGEDATTN_FUZZ_COMMON_H

#include <pagedattn/pagedattn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAF_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PAF_ASAN 1
#endif
#ifdef PAF_ASAN
#include <sanitizer/asan_interface.h>
#define PAF_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define PAF_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define PAF_POISON(p, n) ((void)(p), (void)(n))
#define PAF_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace paf {

[[noreturn]] inline void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s %s\n(last error: \"%s\")\n", what, detail,
               pagedattn_last_error());
  std::fflush(stderr);
  std::abort();
}

#define PAF_CHECK(cond, ...)                                          \
  do {                                                                \
    if (!(cond)) {                                                    \
      char paf_msg_[512];                                             \
      std::snprintf(paf_msg_, sizeof paf_msg_, __VA_ARGS__);          \
      ::paf::die(#cond, paf_msg_);                                    \
    }                                                                 \
  } while (0)

/* Reads typed values from the fuzzer's bytes; past the end everything is 0. */
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t u8() { return n_ ? (--n_, *p_++) : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | (static_cast<uint32_t>(u16()) << 16); }
  uint64_t u64() { return static_cast<uint64_t>(u32()) | (static_cast<uint64_t>(u32()) << 32); }
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  bool flag() { return u8() & 1; }
  /* A value in [lo, hi]. */
  int32_t range(int32_t lo, int32_t hi) {
    const uint32_t span = static_cast<uint32_t>(hi - lo) + 1u;
    return lo + static_cast<int32_t>(span ? u16() % span : u16());
  }
  /* Mostly `good`, sometimes a small perturbation, sometimes anything: keeps most calls deep in
   * the library while every field still sees hostile values. */
  int32_t near_i32(int32_t good) {
    const uint8_t m = u8();
    if (m < 176) return good;
    if (m < 224)  /* wrapping add: good may be INT32_MAX */
      return static_cast<int32_t>(static_cast<uint32_t>(good) +
                                  static_cast<uint32_t>(static_cast<int8_t>(u8())));
    if (m < 240) return -static_cast<int32_t>(u8());
    return i32();
  }
  int64_t near_i64(int64_t good) {
    const uint8_t m = u8();
    if (m < 176) return good;
    if (m < 224)
      return static_cast<int64_t>(static_cast<uint64_t>(good) +
                                  static_cast<uint64_t>(static_cast<int8_t>(u8())));
    if (m < 240) return -static_cast<int64_t>(u8());
    return i64();
  }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

/* A heap buffer with canary zones on both sides. Under ASan the zones are also poisoned, so a
 * read there is reported at once; without it, writes are caught by check(). snapshot()/same()
 * compare the payload with an earlier copy. */
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kCanary = 0xA5;

  explicit Guarded(size_t bytes, uint8_t fill = 0) : n_(bytes) {
    raw_ = static_cast<uint8_t*>(std::malloc(n_ + 2 * kGuard));
    if (!raw_) die("malloc failed in the fuzzer");
    std::memset(raw_, kCanary, kGuard);
    std::memset(raw_ + kGuard, fill, n_);
    std::memset(raw_ + kGuard + n_, kCanary, kGuard);
    PAF_POISON(raw_, kGuard);
    PAF_POISON(raw_ + kGuard + n_, kGuard);
  }
  ~Guarded() {
    check("destroy");
    std::free(raw_);
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;

  uint8_t* data() { return raw_ + kGuard; }
  const uint8_t* data() const { return raw_ + kGuard; }
  size_t size() const { return n_; }

  /* Dies if a canary byte changed. */
  void check(const char* when) const {
    PAF_UNPOISON(raw_, kGuard);
    PAF_UNPOISON(raw_ + kGuard + n_, kGuard);
    for (size_t i = 0; i < kGuard; ++i) {
      if (raw_[i] != kCanary) die("canary before a buffer overwritten", when);
      if (raw_[kGuard + n_ + i] != kCanary) die("canary after a buffer overwritten", when);
    }
    PAF_POISON(raw_, kGuard);
    PAF_POISON(raw_ + kGuard + n_, kGuard);
  }
  std::vector<uint8_t> snapshot() const { return std::vector<uint8_t>(data(), data() + n_); }
  bool same(const std::vector<uint8_t>& s) const {
    return s.size() == n_ && (n_ == 0 || std::memcmp(s.data(), data(), n_) == 0);
  }
  /* Index of the first byte differing from s, or size() if none. */
  size_t first_diff(const std::vector<uint8_t>& s) const {
    for (size_t i = 0; i < n_; ++i)
      if (s[i] != data()[i]) return i;
    return n_;
  }

 private:
  size_t n_;
  uint8_t* raw_;
};

inline pagedattn_dlpack_dtype dl_of(pagedattn_dtype dt) {
  pagedattn_dlpack_dtype d{};
  pagedattn_dtype_to_dlpack(&d, dt);
  return d;
}

/* A status must be a pinned value, and an error must come with a message. */
inline void check_status(pagedattn_status st, const char* call) {
  PAF_CHECK(st >= PAGEDATTN_OK && st <= PAGEDATTN_ERROR_INTERNAL, "%s returned %d", call,
            static_cast<int>(st));
  PAF_CHECK(st != PAGEDATTN_ERROR_INTERNAL, "%s: internal error", call);
  if (st != PAGEDATTN_OK)
    PAF_CHECK(pagedattn_last_error()[0] != '\0', "%s failed with %s but no message", call,
              pagedattn_status_string(st));
  else
    PAF_CHECK(pagedattn_last_error()[0] == '\0', "%s succeeded but left a message", call);
}

/* One CPU backend per process (creating one per input would only measure thread start-up). */
inline pagedattn_backend* cpu_backend() {
  static pagedattn_backend* be = [] {
    pagedattn_backend_options o;
    pagedattn_backend_options_init(&o);
    o.num_threads = 1;
    o.memory_limit = 512ull << 20; /* caches and batch workspaces must respect it */
    pagedattn_backend* b = nullptr;
    if (pagedattn_backend_create(&b, "cpu", &o) != PAGEDATTN_OK) die("cpu backend unavailable");
    return b;
  }();
  return be;
}


/* A tensor descriptor built from fuzzer bytes around a wanted shape and dtype, with guarded
 * memory covering every element it addresses. Fields are mostly right and sometimes hostile.
 * `skip`: it addresses more memory than the fuzzer hands over (the call cannot be made safely
 * unless another argument is surely refused). `overflow`: its extent overflows int64 (must be
 * refused). `malformed`: a rank/shape/device/stride/null the call must refuse. `bad_dtype`: the
 * dtype is neither the wanted one nor `also_ok`; a target whose model dtype is free (an fp8 cache
 * takes any float input) settles it with shared_dtype() instead. */
struct FTensor {
  pagedattn_tensor t{};
  std::vector<int64_t> shape, strides;
  std::unique_ptr<Guarded> mem;
  bool skip = false, overflow = false, malformed = false, bad_dtype = false;
  bool backed = false; /* mem covers every addressed element */
  size_t esize = 1;
  int64_t lo = 0; /* byte offset of the lowest addressed byte from data + byte_offset */
  std::vector<uint8_t> snap;

  void snapshot() { snap = mem ? mem->snapshot() : std::vector<uint8_t>(); }
  void check(const char* when) const {
    if (mem) mem->check(when);
  }
  bool unchanged() const { return !mem || mem->same(snap); }
  /* Calls fn(byte offset in mem) for the first byte of every element. */
  template <class F>
  void for_each_elem(F fn) const {
    const int n = static_cast<int>(shape.size());
    if (n == 0 || !mem || !backed) return;
    std::vector<int64_t> idx(n, 0);
    for (int i = 0; i < n; ++i)
      if (shape[i] <= 0) return;
    for (;;) {
      int64_t off = 0;
      for (int i = 0; i < n; ++i) off += idx[i] * strides[i];
      fn(static_cast<size_t>(off * static_cast<int64_t>(esize) - lo));
      int k = n - 1;
      while (k >= 0 && ++idx[k] == shape[k]) idx[k--] = 0;
      if (k < 0) return;
    }
  }
  /* After a successful call: bytes outside the addressed elements must be as before. */
  void check_writes_inside(const char* when) const {
    if (!mem) return;
    std::vector<uint8_t> allowed(mem->size(), 0);
    for_each_elem([&](size_t b) {
      for (size_t j = 0; j < esize; ++j) allowed[b + j] = 1;
    });
    for (size_t i = 0; i < mem->size(); ++i)
      if (!allowed[i] && mem->data()[i] != snap[i])
        die("a byte outside the tensor's elements changed", when);
  }
};

inline size_t dl_size(pagedattn_dlpack_dtype d) { return d.bits >= 8 ? d.bits / 8 : 1; }

inline bool same_dtype(const pagedattn_dlpack_dtype& a, const pagedattn_dlpack_dtype& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

inline void make_tensor(FTensor& f, Input& in, const std::vector<int64_t>& want,
                        pagedattn_dlpack_dtype want_dt, bool fill_random,
                        size_t max_bytes = size_t(1) << 20,
                        const pagedattn_dlpack_dtype* also_ok = nullptr,
                        bool rows_may_grow = false) {
  const int wn = static_cast<int>(want.size());
  pagedattn_tensor& t = f.t;
  t.ndim = in.near_i32(wn);
  if (t.ndim != wn) f.malformed = true;
  const int n = t.ndim < 0 ? 0 : (t.ndim > 6 ? 6 : t.ndim);
  f.shape.assign(n, 1);
  for (int i = 0; i < n; ++i) {
    f.shape[i] = in.near_i64(i < wn ? want[i] : 1);
    /* rows_may_grow: a first extent above the wanted one is valid (padded token rows). */
    const bool grown_ok = rows_may_grow && i == 0 && i < wn && f.shape[i] > want[i];
    if (i >= wn || (f.shape[i] != want[i] && !grown_ok)) f.malformed = true;
  }
  t.shape = t.ndim > 6 ? nullptr : f.shape.data();
  if (t.ndim > 6) f.malformed = true;
  if (t.ndim > 0 && in.u8() == 255) {
    t.shape = nullptr;
    f.malformed = true;
  }
  t.dtype = want_dt;
  if (in.u8() >= 232) {
    t.dtype.code = in.u8() % 16;
    t.dtype.bits = static_cast<uint8_t>(in.u8() % 2 ? 8u << (in.u8() % 3) : in.u8());
    t.dtype.lanes = static_cast<uint16_t>(in.u8() < 200 ? 1 : in.u16());
    if (!same_dtype(t.dtype, want_dt) && !(also_ok && same_dtype(t.dtype, *also_ok)))
      f.bad_dtype = true;
  }
  f.esize = dl_size(t.dtype);
  t.device.device_type = PAGEDATTN_DEVICE_CPU;
  t.device.device_id = 0;
  if (in.u8() >= 240) {
    t.device.device_type = in.u8() % 14;
    t.device.device_id = in.u8() % 3;
    if (t.device.device_type != PAGEDATTN_DEVICE_CPU) f.malformed = true;
  }
  /* Compact strides, or perturbed ones (negative, zero, huge), or NULL. */
  std::vector<int64_t> compact(n, 1);
  for (int i = n - 2; i >= 0; --i)
    if (__builtin_mul_overflow(compact[i + 1], f.shape[i + 1] > 0 ? f.shape[i + 1] : 1,
                               &compact[i]))
      compact[i] = INT64_MAX; /* saturate: such a tensor cannot be backed anyway */
  f.strides = compact;
  const uint8_t sm = in.u8();
  if (sm < 64) {
    t.strides = nullptr;
  } else {
    for (int i = 0; i < n; ++i) {
      if (sm >= 160) {
        const int64_t pad = i + 1 < n ? in.u8() % 3 : 0;
        f.strides[i] = in.near_i64(compact[i] <= INT64_MAX - pad ? compact[i] + pad : compact[i]);
      }
    }
    t.strides = f.strides.data();
  }
  /* A non-unit innermost stride must be refused, except on a tensor with no elements, which
   * the library may skip without looking at its strides. */
  bool no_elems = false;
  for (int i = 0; i < n; ++i)
    if (f.shape[i] == 0) no_elems = true;
  if (t.strides && n > 0 && f.strides[n - 1] != 1 && !no_elems) f.malformed = true;
  t.byte_offset = 0;
  const uint8_t om = in.u8();
  if (om >= 200) t.byte_offset = om >= 250 ? in.u64() : (in.u8() % 8) * f.esize + (om == 249);
  /* The addressed byte range relative to data + byte_offset. */
  bool empty = false;
  for (int i = 0; i < n; ++i)
    if (f.shape[i] <= 0) empty = true;
  __int128 lo = 0, hi = 0;
  if (!empty && t.shape) {
    /* Each span is below 2^126; the sums saturate at 2^100 (far past INT64_MAX) so that six of
     * them, and the multiplication by esize below, cannot overflow __int128. */
    const __int128 cap = static_cast<__int128>(1) << 100;
    for (int i = 0; i < n; ++i) {
      const __int128 span = static_cast<__int128>(f.shape[i] - 1) * f.strides[i];
      if (span < 0) lo = std::max(lo + span, -cap); else hi = std::min(hi + span, cap);
    }
    hi += 1;
    const __int128 lim = static_cast<__int128>(INT64_MAX);
    if (lo * static_cast<__int128>(f.esize) < -lim || hi * static_cast<__int128>(f.esize) > lim)
      f.overflow = true;
    else {
      for (int i = 0; i < n; ++i) {
        int64_t tmp;
        if (__builtin_mul_overflow(f.shape[i] - 1, f.strides[i], &tmp)) f.overflow = true;
      }
    }
  }
  const __int128 bytes = (hi - lo) * static_cast<__int128>(f.esize);
  /* Elements, which zero strides make far more than the bytes they span: the targets visit each
   * one (for_each_elem), so too many cannot be backed either. */
  __int128 elems = 1;
  if (!empty && t.shape)
    for (int i = 0; i < n && elems <= static_cast<__int128>(max_bytes); ++i) elems *= f.shape[i];
  /* Without a readable shape no element can be located: nothing is backed. */
  const bool locatable = empty || t.shape != nullptr;
  if (!locatable) {
    f.mem = std::make_unique<Guarded>(16);
    t.data = f.mem->data();
    f.lo = 0;
  } else if (f.overflow || bytes > static_cast<__int128>(max_bytes) ||
             elems > static_cast<__int128>(max_bytes) || t.byte_offset > (uint64_t(1) << 20)) {
    /* Cannot be backed: a tiny buffer, so a call that wrongly accepts it is caught by ASan. */
    if (!f.overflow) f.skip = true;
    f.mem = std::make_unique<Guarded>(16);
    t.data = f.mem->data();
    t.byte_offset = 0;
    f.lo = 0;
  } else {
    f.lo = static_cast<int64_t>(lo) * static_cast<int64_t>(f.esize);
    f.mem = std::make_unique<Guarded>(static_cast<size_t>(bytes));
    f.backed = true;
    if (fill_random)
      for (size_t i = 0; i < f.mem->size(); ++i) f.mem->data()[i] = in.u8();
    /* data + byte_offset + lo == mem */
    t.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(f.mem->data()) -
                                     static_cast<uintptr_t>(f.lo) -
                                     static_cast<uintptr_t>(t.byte_offset));
  }
  if (in.u8() == 254) {
    t.data = nullptr;
    if (!empty) f.malformed = true;
  }
}

/* Tensors that must share one float dtype, chosen by `lead` (q, or a cache write's key): the lead
 * must be float32, float16 or bfloat16, and `must` when given (a non-fp8 cache's dtype); the rest
 * must equal the lead. Replaces make_tensor's bad_dtype, which judged against one fixed dtype. */
inline void shared_dtype(FTensor& lead, const std::vector<FTensor*>& rest,
                         const pagedattn_dlpack_dtype* must) {
  const pagedattn_dlpack_dtype& d = lead.t.dtype;
  const bool is_float = d.lanes == 1 && ((d.code == PAGEDATTN_DLPACK_FLOAT &&
                                          (d.bits == 32 || d.bits == 16)) ||
                                         (d.code == PAGEDATTN_DLPACK_BFLOAT && d.bits == 16));
  lead.bad_dtype = !is_float || (must && !same_dtype(d, *must));
  for (FTensor* t : rest) t->bad_dtype = !same_dtype(t->t.dtype, d);
}

}  // namespace paf

#endif /* PAGEDATTN_FUZZ_COMMON_H */
