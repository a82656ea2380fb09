// Seeds, device memory behind hooks, strided test tensors, backend selection.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "pagedattn_test_support.h"

namespace pat {

uint64_t test_seed() {
  const char* s = std::getenv("PAGEDATTN_TEST_SEED");
  if (s && *s) return std::strtoull(s, nullptr, 0);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

namespace {

uint64_t sample_every() {
  const char* s = std::getenv("PAGEDATTN_TEST_SAMPLE");
  const uint64_t n = s && *s ? std::strtoull(s, nullptr, 0) : 1;
  return n > 1 ? n : 1;
}

}  // namespace

std::string seed_note(uint64_t seed) {
  std::ostringstream o;
  o << "seed=" << seed << " (rerun: PAGEDATTN_TEST_SEED=" << seed;
  if (sample_every() > 1) o << " PAGEDATTN_TEST_SAMPLE=" << sample_every();
  o << ")";
  return o.str();
}

bool case_sampled(uint64_t master, size_t index, size_t count) {
  const uint64_t n = sample_every();
  if (n == 1) return true;
  if (count <= n) return index == master % count;
  return (index + master) % n == 0;
}

namespace {

void* host_alloc(size_t bytes) {
  // 64-byte aligned like a framework allocation; at least one line so the pointer is non-NULL.
  const size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  return std::aligned_alloc(64, n);
}
void host_free(void* p) { std::free(p); }
void host_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

const device_hooks kCpuHooks = {PAGEDATTN_DEVICE_CPU, host_alloc, host_free, host_copy,
                                host_copy};

std::mutex g_hooks_mu;
std::map<int32_t, device_hooks>& hooks_map() {
  static std::map<int32_t, device_hooks> m;
  return m;
}

}  // namespace

void set_device_hooks(const device_hooks* hooks) {
  std::lock_guard<std::mutex> lk(g_hooks_mu);
  hooks_map()[hooks->device_type] = *hooks;
}

const device_hooks* get_device_hooks(int32_t device_type) {
  if (device_type == PAGEDATTN_DEVICE_CPU) return &kCpuHooks;
  std::lock_guard<std::mutex> lk(g_hooks_mu);
  auto it = hooks_map().find(device_type);
  return it == hooks_map().end() ? nullptr : &it->second;
}

DevBuf::DevBuf(pagedattn_device device, size_t bytes)
    : device_(device), hooks_(get_device_hooks(device.device_type)), bytes_(bytes),
      dev_(nullptr), host_(bytes) {
  if (!hooks_) {
    ADD_FAILURE() << "no device hooks for device type " << device.device_type;
    return;
  }
  dev_ = hooks_->alloc(bytes);
  if (!dev_) ADD_FAILURE() << "test device allocation of " << bytes << " bytes failed";
}

DevBuf::~DevBuf() {
  if (hooks_ && dev_) hooks_->free(dev_);
}

void DevBuf::upload() {
  if (dev_ && bytes_) hooks_->to_device(dev_, host_.data(), bytes_);
}

void DevBuf::download() {
  if (dev_ && bytes_) hooks_->to_host(host_.data(), dev_, bytes_);
}

static size_t span_elems(int ndim, int64_t rows, int64_t heads, int64_t dim, int64_t rs,
                         int64_t hs, uint64_t off_elems) {
  int64_t last = 0;
  if (rows > 0 && heads > 0 && dim > 0) {
    last = (rows - 1) * rs + (ndim >= 2 ? (heads - 1) * hs : 0) + (ndim == 3 ? dim - 1 : 0);
  }
  return static_cast<size_t>(off_elems) + static_cast<size_t>(last) + 1;
}

Tensor::Tensor(pagedattn_device device, pagedattn_dtype dt, int ndim, int64_t rows, int64_t heads,
               int64_t dim, int64_t rs, int64_t hs, uint64_t off)
    : dt_(dt), ndim_(ndim), rows_(rows), heads_(heads), dim_(dim), rs_(rs), hs_(hs), off_(off),
      buf_(device, span_elems(ndim, rows, heads, dim, rs, hs, off / dtype_bytes(dt)) *
                       dtype_bytes(dt)) {
  if (ndim == 3) {
    shape = {rows, heads, dim};
    strides = {rs, hs, 1};
  } else if (ndim == 2) {
    shape = {rows, heads};
    strides = {rs, 1};
  } else {
    shape = {rows};
    strides = {1};
  }
  t_.data = buf_.ptr();
  t_.device = device;
  t_.ndim = ndim;
  t_.dtype = dlpack_of(dt);
  t_.shape = shape.data();
  t_.strides = strides.data();
  t_.byte_offset = off;
  std::fill(buf_.host().begin(), buf_.host().end(), 0);
}

Tensor::Tensor(pagedattn_device device, pagedattn_dtype dt, int64_t rows, int64_t heads,
               int64_t dim, int64_t row_stride, int64_t head_stride, uint64_t byte_offset)
    : Tensor(device, dt, 3, rows, heads, dim, row_stride ? row_stride : heads * dim,
             head_stride ? head_stride : dim, byte_offset) {}

std::unique_ptr<Tensor> Tensor::make2d(pagedattn_device device, pagedattn_dtype dt, int64_t rows,
                                       int64_t heads, int64_t row_stride, int64_t head_stride,
                                       uint64_t byte_offset) {
  // Head stride of a 2-D tensor is 1 (unit innermost); head_stride is accepted for symmetry.
  (void)head_stride;
  return std::unique_ptr<Tensor>(new Tensor(device, dt, 2, rows, heads, 1,
                                            row_stride ? row_stride : heads, 1, byte_offset));
}

std::unique_ptr<Tensor> Tensor::make1d(pagedattn_device device, pagedattn_dtype dt, int64_t n) {
  return std::unique_ptr<Tensor>(new Tensor(device, dt, 1, n, 1, 1, 1, 1, 0));
}

size_t Tensor::elem_offset(int64_t r, int64_t h, int64_t d) const {
  int64_t e = r * rs_;
  if (ndim_ >= 2) e += h * hs_;
  if (ndim_ == 3) e += d;
  return static_cast<size_t>(off_ / dtype_bytes(dt_) + e);
}

void Tensor::set(int64_t r, int64_t h, int64_t d, float x) {
  store(dt_, buf_.host().data() + elem_offset(r, h, d) * dtype_bytes(dt_), x);
}

float Tensor::get(int64_t r, int64_t h, int64_t d) const {
  return load(dt_, buf_.host().data() + elem_offset(r, h, d) * dtype_bytes(dt_));
}

void Tensor::set_raw(int64_t index_elems, const void* src) {
  std::memcpy(buf_.host().data() + index_elems * dtype_bytes(dt_), src, dtype_bytes(dt_));
}

void Tensor::poison_all() {
  const size_t es = dtype_bytes(dt_);
  for (size_t i = 0; i + es <= buf_.host().size(); i += es) store_poison(dt_, &buf_.host()[i]);
}

bool Tensor::padding_untouched(std::string* why) const {
  const size_t es = dtype_bytes(dt_);
  const size_t n = buf_.host().size() / es;
  std::vector<uint8_t> logical(n, 0);
  const int64_t hn = ndim_ >= 2 ? heads_ : 1, dn = ndim_ == 3 ? dim_ : 1;
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t h = 0; h < hn; ++h)
      for (int64_t d = 0; d < dn; ++d) logical[elem_offset(r, h, d)] = 1;
  uint8_t poison[4];
  store_poison(dt_, poison);
  for (size_t i = 0; i < n; ++i) {
    if (!logical[i] && std::memcmp(&buf_.host()[i * es], poison, es) != 0) {
      if (why) {
        std::ostringstream o;
        o << "element " << i << " of the buffer lies outside the tensor but was written";
        *why = o.str();
      }
      return false;
    }
  }
  return true;
}

std::string backend_name() {
  const char* s = std::getenv("PAGEDATTN_TEST_BACKEND");
  return (s && *s) ? s : "cpu";
}

void BackendTest::SetUp() {
  const std::string name = backend_name();
  pagedattn_status st = pagedattn_backend_create(&be, name.c_str(), nullptr);
  if (st != PAGEDATTN_OK) {
    be = nullptr;
    const char* target = std::getenv("PAGEDATTN_CPU_TARGET");
    if (st == PAGEDATTN_ERROR_UNSUPPORTED && target && *target) {
      GTEST_SKIP() << "skipped: target " << target << " not supported here ("
                   << pagedattn_last_error() << ")";
    }
    if (name != "cpu" && (st == PAGEDATTN_ERROR_BACKEND_UNAVAILABLE ||
                          st == PAGEDATTN_ERROR_PLUGIN)) {
      // Suites whose backend always exists (the GPU emulator's) fail instead of skipping.
      const char* req = std::getenv("PAGEDATTN_TEST_REQUIRE_BACKEND");
      if (req && *req && std::strcmp(req, "0") != 0) {
        FAIL() << "backend " << name << " unavailable (" << pagedattn_last_error()
               << ") though PAGEDATTN_TEST_REQUIRE_BACKEND is set";
      }
      if (name == "cuda" || name == "hip") {
        GTEST_SKIP() << "skipped: no GPU (backend " << name << ": " << pagedattn_last_error()
                     << ")";
      }
      GTEST_SKIP() << "skipped: backend " << name << " unavailable here ("
                   << pagedattn_last_error() << ")";
    }
    FAIL() << "pagedattn_backend_create(\"" << name << "\") = " << pagedattn_status_string(st)
           << ": " << pagedattn_last_error();
  }
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK) << pagedattn_last_error();
  dev = caps.device;
  if (!get_device_hooks(dev.device_type)) {
    GTEST_SKIP() << "skipped: backend " << name << " needs memory of device type "
                 << dev.device_type << " and this test binary has no hooks for it";
  }
}

void BackendTest::TearDown() {
  pagedattn_backend_destroy(be);
  be = nullptr;
}

std::string last_error() { return pagedattn_last_error(); }

static std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

::testing::AssertionResult status_is(pagedattn_status got, pagedattn_status want,
                                     const std::string& needle) {
  const std::string msg = pagedattn_last_error();
  if (got != want) {
    return ::testing::AssertionFailure()
           << "status " << pagedattn_status_string(got) << " (" << got << "), want "
           << pagedattn_status_string(want) << "; message: \"" << msg << "\"";
  }
  if (want != PAGEDATTN_OK && msg.empty()) {
    return ::testing::AssertionFailure()
           << pagedattn_status_string(got) << " but pagedattn_last_error() is empty";
  }
  if (!needle.empty() && lower(msg).find(lower(needle)) == std::string::npos) {
    return ::testing::AssertionFailure()
           << pagedattn_status_string(got) << " with message \"" << msg
           << "\", which does not mention \"" << needle << "\"";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace pat
