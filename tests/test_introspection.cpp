// What a backend tells about itself: the code path it runs and the settings it read
// (capabilities), the memory it holds, a batch's sizes, and the log callback.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

pagedattn_memory_usage usage_of(const pagedattn_backend* be) {
  pagedattn_memory_usage u{};
  u.struct_size = sizeof u;
  EXPECT_EQ(pagedattn_backend_get_memory_usage(&u, be), PAGEDATTN_OK) << pat::last_error();
  return u;
}

class Introspection : public pat::BackendTest {
 protected:
  pagedattn_kv_cache* make_cache(int32_t blocks) {
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    g.num_layers = 2;
    g.num_blocks = blocks;
    g.block_size = 16;
    g.num_kv_heads = 2;
    g.head_size = 64;
    g.dtype = PAGEDATTN_DTYPE_FLOAT16;
    pagedattn_kv_cache* c = nullptr;
    EXPECT_EQ(pagedattn_kv_cache_create(&c, be, &g), PAGEDATTN_OK) << pat::last_error();
    return c;
  }
};

}  // namespace

TEST_F(Introspection, TargetAndSettingsNameThePathRun) {
  ASSERT_NE(caps.target, nullptr);
  ASSERT_NE(caps.settings, nullptr);
  const std::string target = caps.target, settings = caps.settings;
  EXPECT_FALSE(target.empty());
  EXPECT_FALSE(settings.empty());
  if (caps.device.device_type != PAGEDATTN_DEVICE_CPU) {
    // A GPU names its architecture.
    EXPECT_TRUE(target.rfind("sm_", 0) == 0 || target.rfind("gfx", 0) == 0) << target;
    return;
  }
  EXPECT_TRUE(contains(settings, "target " + target)) << settings;
  EXPECT_TRUE(contains(settings, "PAGEDATTN_CPU_SPIN_US")) << settings;
  // The target this backend reports, asked for by name, is the one a new backend runs, and the
  // variables read are named with their values.
  const std::string name = pat::backend_name();
  ScopedEnv forced("PAGEDATTN_CPU_TARGET", target.c_str());
  ScopedEnv spin("PAGEDATTN_CPU_SPIN_US", "250");
  pagedattn_backend* other = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&other, name.c_str(), nullptr), PAGEDATTN_OK)
      << pat::last_error();
  pagedattn_capabilities c{};
  c.struct_size = sizeof c;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&c, other), PAGEDATTN_OK);
  EXPECT_STREQ(c.target, target.c_str());
  const std::string s = c.settings;
  EXPECT_TRUE(contains(s, "(PAGEDATTN_CPU_TARGET)")) << s;
  EXPECT_TRUE(contains(s, "spin 250 us (PAGEDATTN_CPU_SPIN_US=250)")) << s;
  if (name == "onednn") {
    EXPECT_TRUE(contains(s, "PAGEDATTN_ONEDNN_MIN_QUERY unset")) << s;
    // Unasked, float32 tiles never run: bf16 chunks on bf16 tiles where the CPU has them.
    EXPECT_TRUE(contains(s, "bf16 chunks of 16 or more query tokens on bf16 matmul tiles, "
                            "other dtypes' on the cpu kernels") ||
                contains(s, "no bf16 matmul here, every chunk on the cpu kernels"))
        << s;
    pagedattn_backend* dnn = nullptr;
    ScopedEnv min_query("PAGEDATTN_ONEDNN_MIN_QUERY", "32");
    ScopedEnv f32("PAGEDATTN_ONEDNN_BF16", "0");
    ASSERT_EQ(pagedattn_backend_create(&dnn, "onednn", nullptr), PAGEDATTN_OK);
    pagedattn_capabilities d{};
    d.struct_size = sizeof d;
    ASSERT_EQ(pagedattn_backend_get_capabilities(&d, dnn), PAGEDATTN_OK);
    const std::string ds = d.settings;
    EXPECT_TRUE(contains(ds, "chunks of 32 or more query tokens on float32 matmul tiles")) << ds;
    EXPECT_TRUE(contains(ds, "PAGEDATTN_ONEDNN_BF16=0, PAGEDATTN_ONEDNN_MIN_QUERY=32")) << ds;
    pagedattn_backend_destroy(dnn);
  }
  pagedattn_backend_destroy(other);
}

TEST_F(Introspection, OlderCapabilitiesStructGetsOnlyItsFields) {
  // A caller built against 0.1 passes the struct without target and settings.
  unsigned char raw[sizeof(pagedattn_capabilities) + 16];
  std::memset(raw, 0xEE, sizeof raw);
  const uint32_t old_size = offsetof(pagedattn_capabilities, target);
  std::memcpy(raw, &old_size, sizeof old_size);
  ASSERT_EQ(pagedattn_backend_get_capabilities(reinterpret_cast<pagedattn_capabilities*>(raw), be),
            PAGEDATTN_OK)
      << pat::last_error();
  uint32_t features = 0;
  std::memcpy(&features, raw + offsetof(pagedattn_capabilities, features), sizeof features);
  EXPECT_EQ(features, caps.features);
  for (size_t i = old_size; i < sizeof raw; ++i)
    ASSERT_EQ(raw[i], 0xEE) << "byte " << i << " beyond struct_size written";
  // One byte short of the 0.1 layout is no known size.
  const uint32_t short_size = old_size - 1;
  std::memcpy(raw, &short_size, sizeof short_size);
  EXPECT_TRUE(status_is(
      pagedattn_backend_get_capabilities(reinterpret_cast<pagedattn_capabilities*>(raw), be),
      PAGEDATTN_ERROR_STRUCT_SIZE, "minimum"));
}

TEST_F(Introspection, MemoryUsageFollowsCachesAndBatches) {
  const pagedattn_memory_usage base = usage_of(be);
  EXPECT_EQ(base.num_caches, 0);
  EXPECT_EQ(base.num_batches, 0);
  EXPECT_EQ(base.bytes_in_use, 0u);
  EXPECT_EQ(base.memory_limit, 0u);

  pagedattn_kv_cache* cache = make_cache(40);
  ASSERT_NE(cache, nullptr);
  const uint64_t cache_bytes = 40ull * 2 * 2 * 16 * 2 * 64 * 2;  // blocks, layers, K+V, ...
  pagedattn_memory_usage u = usage_of(be);
  EXPECT_EQ(u.num_caches, 1);
  EXPECT_EQ(u.bytes_in_use, cache_bytes);

  const std::vector<int32_t> q = {7, 1}, c = {0, 30}, tab = {3, 9, 0, 0, 11, 12};
  pagedattn_batch_desc d;
  pagedattn_batch_desc_init(&d);
  d.num_seqs = 2;
  d.query_lens = q.data();
  d.context_lens = c.data();
  d.block_tables = tab.data();
  d.block_table_stride = 3;
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &d), PAGEDATTN_OK)
      << pat::last_error();
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(pagedattn_batch_get_info(&info, batch), PAGEDATTN_OK);
  EXPECT_GT(info.host_bytes, 0u);
  EXPECT_GT(info.workspace_bytes, 0u);
  u = usage_of(be);
  EXPECT_EQ(u.num_batches, 1);
  EXPECT_EQ(u.bytes_in_use, cache_bytes + info.host_bytes + info.workspace_bytes);

  // Sized for the capacities: an update changes neither.
  const std::vector<int32_t> q2 = {1, 1}, c2 = {7, 31};
  d.query_lens = q2.data();
  d.context_lens = c2.data();
  ASSERT_EQ(pagedattn_batch_update(batch, &d), PAGEDATTN_OK) << pat::last_error();
  pagedattn_batch_info after{};
  after.struct_size = sizeof after;
  ASSERT_EQ(pagedattn_batch_get_info(&after, batch), PAGEDATTN_OK);
  EXPECT_EQ(after.host_bytes, info.host_bytes);
  EXPECT_EQ(after.workspace_bytes, info.workspace_bytes);
  EXPECT_EQ(usage_of(be).bytes_in_use, u.bytes_in_use);

  // A caller built against 0.1 gets the batch info without the byte counts.
  unsigned char raw[sizeof(pagedattn_batch_info) + 8];
  std::memset(raw, 0xEE, sizeof raw);
  const uint32_t old_size = offsetof(pagedattn_batch_info, host_bytes);
  std::memcpy(raw, &old_size, sizeof old_size);
  ASSERT_EQ(pagedattn_batch_get_info(reinterpret_cast<pagedattn_batch_info*>(raw), batch),
            PAGEDATTN_OK);
  for (size_t i = old_size; i < sizeof raw; ++i) ASSERT_EQ(raw[i], 0xEE) << "byte " << i;

  pagedattn_batch_destroy(batch);
  u = usage_of(be);
  EXPECT_EQ(u.num_batches, 0);
  EXPECT_EQ(u.bytes_in_use, cache_bytes);
  pagedattn_kv_cache_destroy(cache);
  u = usage_of(be);
  EXPECT_EQ(u.num_caches, 0);
  EXPECT_EQ(u.bytes_in_use, 0u);
}

TEST_F(Introspection, LimitBoundsCachesMetadataAndWorkspacesTogether) {
  // What a cache and a batch take on the unlimited backend; then a limit one byte short of it,
  // which the core's count refuses whatever the backend's own check (which also counts its
  // allocator's headers) says, and one with room for those headers.
  // A wide table row makes the host metadata larger than the backend's allocator headers, so
  // one byte short is past the core's count and within the backend's own.
  const std::vector<int32_t> q = {5}, c = {0};
  std::vector<int32_t> tab(512, 0);
  tab[1] = 2;
  pagedattn_batch_desc d;
  pagedattn_batch_desc_init(&d);
  d.num_seqs = 1;
  d.query_lens = q.data();
  d.context_lens = c.data();
  d.block_tables = tab.data();
  d.block_table_stride = 512;
  auto plan = [&](pagedattn_backend* on, pagedattn_kv_cache* cache, pagedattn_batch** out) {
    return pagedattn_batch_create(out, on, cache, nullptr, &d);
  };
  pagedattn_kv_cache* cache = make_cache(3);
  ASSERT_NE(cache, nullptr);
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(plan(be, cache, &batch), PAGEDATTN_OK) << pat::last_error();
  const uint64_t total = usage_of(be).bytes_in_use;
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);

  for (const uint64_t limit : {total + 4096, total - 1}) {
    pagedattn_backend_options o;
    pagedattn_backend_options_init(&o);
    o.memory_limit = limit;
    pagedattn_backend* limited = nullptr;
    ASSERT_EQ(pagedattn_backend_create(&limited, pat::backend_name().c_str(), &o), PAGEDATTN_OK);
    std::swap(be, limited);
    cache = make_cache(3);
    std::swap(be, limited);
    ASSERT_NE(cache, nullptr);
    const uint64_t cache_bytes = usage_of(limited).bytes_in_use;
    batch = nullptr;
    const pagedattn_status st = plan(limited, cache, &batch);
    const auto refused = status_is(st, PAGEDATTN_ERROR_OUT_OF_MEMORY, "memory_limit");
    const bool by_core = std::string(pagedattn_last_error()).rfind("batch workspace: ", 0) == 0;
    const pagedattn_memory_usage u = usage_of(limited);
    if (limit > total) {
      EXPECT_EQ(st, PAGEDATTN_OK) << pat::last_error();
      EXPECT_EQ(u.bytes_in_use, total);
    } else {
      EXPECT_TRUE(refused);
      EXPECT_TRUE(by_core) << "refused by the core's count of the workspace";
      EXPECT_EQ(batch, nullptr);
      EXPECT_EQ(u.bytes_in_use, cache_bytes) << "a refused batch holds nothing";
      EXPECT_EQ(u.num_batches, 0);
    }
    EXPECT_LE(u.bytes_in_use, limit);
    pagedattn_batch_destroy(batch);
    pagedattn_kv_cache_destroy(cache);
    EXPECT_EQ(usage_of(limited).bytes_in_use, 0u);
    pagedattn_backend_destroy(limited);
  }
}

TEST_F(Introspection, MemoryUsageReportsTheLimitAndRefusesBadArguments) {
  pagedattn_backend_options o;
  pagedattn_backend_options_init(&o);
  o.memory_limit = 123456789;
  pagedattn_backend* limited = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&limited, pat::backend_name().c_str(), &o), PAGEDATTN_OK)
      << pat::last_error();
  EXPECT_EQ(usage_of(limited).memory_limit, 123456789u);
  pagedattn_memory_usage u{};
  u.struct_size = sizeof u;
  EXPECT_TRUE(status_is(pagedattn_backend_get_memory_usage(nullptr, limited),
                        PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(pagedattn_backend_get_memory_usage(&u, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  u.struct_size = 4;
  EXPECT_TRUE(status_is(pagedattn_backend_get_memory_usage(&u, limited),
                        PAGEDATTN_ERROR_STRUCT_SIZE));
  u.struct_size = sizeof u;
  pagedattn_backend_destroy(limited);
  EXPECT_TRUE(status_is(pagedattn_backend_get_memory_usage(&u, limited),
                        PAGEDATTN_ERROR_INVALID_HANDLE));
}

namespace {

struct Logged {
  pagedattn_log_level level;
  std::string message;
};

struct LogSink {
  std::mutex mu;
  std::vector<Logged> lines;
  bool try_replace = false;              // the callback calls pagedattn_set_log_callback
  pagedattn_status replace_status = PAGEDATTN_OK;

  static void callback(void* user, pagedattn_log_level level, const char* message) {
    auto* sink = static_cast<LogSink*>(user);
    std::lock_guard<std::mutex> lock(sink->mu);
    sink->lines.push_back({level, message});
    if (sink->try_replace)
      sink->replace_status = pagedattn_set_log_callback(nullptr, nullptr, PAGEDATTN_LOG_ERROR);
  }
  std::vector<Logged> take() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<Logged> out;
    out.swap(lines);
    return out;
  }
};

// Detaches the callback when a test ends, whatever it asserted.
struct LogDetach {
  ~LogDetach() { pagedattn_set_log_callback(nullptr, nullptr, PAGEDATTN_LOG_ERROR); }
};

}  // namespace

TEST_F(Introspection, LogCallbackGetsErrorsAtItsLevel) {
  LogSink sink;
  LogDetach detach;
  ASSERT_EQ(pagedattn_set_log_callback(LogSink::callback, &sink, PAGEDATTN_LOG_ERROR),
            PAGEDATTN_OK);
  EXPECT_EQ(pagedattn_batch_desc_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER);
  const std::string expected = std::string("PAGEDATTN_ERROR_NULL_POINTER: ") + pagedattn_last_error();
  auto got = sink.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].level, PAGEDATTN_LOG_ERROR);
  EXPECT_EQ(got[0].message, expected);

  // A failure on another thread reaches it too, with that thread's message.
  std::thread t([] {
    pagedattn_memory_usage u{};
    EXPECT_EQ(pagedattn_backend_get_memory_usage(&u, nullptr), PAGEDATTN_ERROR_STRUCT_SIZE);
  });
  t.join();
  got = sink.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(contains(got[0].message, "PAGEDATTN_ERROR_STRUCT_SIZE: out->struct_size = 0"))
      << got[0].message;

  // At ERROR, creating a backend logs nothing; at INFO it logs the settings line.
  pagedattn_backend* other = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&other, pat::backend_name().c_str(), nullptr), PAGEDATTN_OK);
  pagedattn_backend_destroy(other);
  EXPECT_TRUE(sink.take().empty());
  ASSERT_EQ(pagedattn_set_log_callback(LogSink::callback, &sink, PAGEDATTN_LOG_INFO),
            PAGEDATTN_OK);
  ASSERT_EQ(pagedattn_backend_create(&other, pat::backend_name().c_str(), nullptr), PAGEDATTN_OK);
  got = sink.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].level, PAGEDATTN_LOG_INFO);
  EXPECT_TRUE(contains(got[0].message, "backend created")) << got[0].message;
  EXPECT_TRUE(contains(got[0].message, caps.settings)) << got[0].message;

  // DEBUG adds caches and batches with their sizes.
  ASSERT_EQ(pagedattn_set_log_callback(LogSink::callback, &sink, PAGEDATTN_LOG_DEBUG),
            PAGEDATTN_OK);
  pagedattn_kv_cache* cache = make_cache(4);
  ASSERT_NE(cache, nullptr);
  pagedattn_kv_cache_destroy(cache);
  got = sink.take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].level, PAGEDATTN_LOG_DEBUG);
  EXPECT_TRUE(contains(got[0].message, "cache created: 2 layers x 4 blocks of 16 tokens"))
      << got[0].message;
  EXPECT_TRUE(contains(got[1].message, "cache destroyed: 65536 bytes released"))
      << got[1].message;
  pagedattn_backend_destroy(other);

  // A bad level is refused and the callback in place stays.
  EXPECT_TRUE(status_is(pagedattn_set_log_callback(LogSink::callback, &sink,
                                                   static_cast<pagedattn_log_level>(3)),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT, "max_level = 3"));
  got = sink.take();
  ASSERT_EQ(got.size(), 1u) << "the refusal itself is logged by the callback still in place";
  EXPECT_TRUE(contains(got[0].message, "max_level = 3")) << got[0].message;

  // NULL stops logging.
  ASSERT_EQ(pagedattn_set_log_callback(nullptr, nullptr, PAGEDATTN_LOG_DEBUG), PAGEDATTN_OK);
  EXPECT_EQ(pagedattn_batch_desc_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER);
  EXPECT_TRUE(sink.take().empty());
}

TEST_F(Introspection, LogCallbackCannotBeReplacedFromInside) {
  LogSink sink;
  LogDetach detach;
  sink.try_replace = true;
  ASSERT_EQ(pagedattn_set_log_callback(LogSink::callback, &sink, PAGEDATTN_LOG_ERROR),
            PAGEDATTN_OK);
  EXPECT_EQ(pagedattn_batch_desc_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER);
  const auto got = sink.take();
  ASSERT_EQ(got.size(), 1u) << "the refused call inside the callback is not logged again";
  EXPECT_EQ(sink.replace_status, PAGEDATTN_ERROR_INVALID_ARGUMENT);
  // The callback is still in place.
  sink.try_replace = false;
  EXPECT_EQ(pagedattn_batch_desc_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER);
  EXPECT_EQ(sink.take().size(), 1u);
}
