// Backend listing, creation, options and capabilities.
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

bool find_info(const char* name, pagedattn_backend_info* out) {
  const int32_t n = pagedattn_backend_count();
  for (int32_t i = 0; i < n; ++i) {
    pagedattn_backend_info info{};
    info.struct_size = sizeof info;
    if (pagedattn_backend_get_info(&info, i) != PAGEDATTN_OK) return false;
    if (info.name && std::strcmp(info.name, name) == 0) {
      *out = info;
      return true;
    }
  }
  return false;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

TEST(Backends, CountAndInfo) {
  const int32_t n = pagedattn_backend_count();
  ASSERT_GE(n, 4) << "cpu, onednn, cuda, hip are always known";
  std::set<std::string> names;
  for (int32_t i = 0; i < n; ++i) {
    pagedattn_backend_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(pagedattn_backend_get_info(&info, i), PAGEDATTN_OK) << pagedattn_last_error();
    ASSERT_NE(info.name, nullptr);
    ASSERT_NE(info.reason, nullptr);
    names.insert(info.name);
    if (info.available) {
      EXPECT_STREQ(info.reason, "") << info.name;
    } else {
      EXPECT_STRNE(info.reason, "") << info.name << " is unavailable without a reason";
    }
  }
  for (const char* want : {"cpu", "onednn", "cuda", "hip"}) EXPECT_TRUE(names.count(want)) << want;
  pagedattn_backend_info cpu{};
  ASSERT_TRUE(find_info("cpu", &cpu));
  EXPECT_EQ(cpu.available, 1);
}

TEST(Backends, GpuUnavailableSaysWhy) {
  // This machine has no GPU in CI; where one exists the check does not apply.
  for (const char* name : {"cuda", "hip"}) {
    pagedattn_backend_info info{};
    ASSERT_TRUE(find_info(name, &info));
    if (info.available) {
      GTEST_LOG_(INFO) << name << " is available here; nothing to check";
      continue;
    }
    const std::string why = lower(info.reason);
    const bool names_plugin = why.find(std::string("libpagedattn-") + name) != std::string::npos;
    const bool names_device = why.find("device") != std::string::npos ||
                              why.find("driver") != std::string::npos;
    EXPECT_TRUE(names_plugin || names_device) << name << ": reason \"" << info.reason
                                              << "\" names neither the plugin nor the device";
    pagedattn_backend* be = nullptr;
    const pagedattn_status st = pagedattn_backend_create(&be, name, nullptr);
    EXPECT_TRUE(st == PAGEDATTN_ERROR_BACKEND_UNAVAILABLE || st == PAGEDATTN_ERROR_PLUGIN)
        << name << ": " << pagedattn_status_string(st);
    EXPECT_STRNE(pagedattn_last_error(), "");
    EXPECT_EQ(be, nullptr);
  }
}

TEST(Backends, InfoRefusals) {
  pagedattn_backend_info info{};
  info.struct_size = sizeof info;
  EXPECT_TRUE(status_is(pagedattn_backend_get_info(nullptr, 0), PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(pagedattn_backend_get_info(&info, -1), PAGEDATTN_ERROR_OUT_OF_RANGE));
  EXPECT_TRUE(status_is(pagedattn_backend_get_info(&info, pagedattn_backend_count()),
                        PAGEDATTN_ERROR_OUT_OF_RANGE));
  info.struct_size = 3;
  EXPECT_TRUE(status_is(pagedattn_backend_get_info(&info, 0), PAGEDATTN_ERROR_STRUCT_SIZE));
}

TEST(Backends, CreateCpuAndAuto) {
  pagedattn_backend* be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "cpu", nullptr), PAGEDATTN_OK) << pagedattn_last_error();
  ASSERT_NE(be, nullptr);
  EXPECT_STREQ(pagedattn_last_error(), "");
  EXPECT_EQ(pagedattn_backend_synchronize(be, nullptr), PAGEDATTN_OK);
  pagedattn_backend_destroy(be);

  be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "auto", nullptr), PAGEDATTN_OK) << pagedattn_last_error();
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK);
  ASSERT_NE(caps.name, nullptr);
  pagedattn_backend_info cuda{}, hip{}, onednn{};
  ASSERT_TRUE(find_info("cuda", &cuda));
  ASSERT_TRUE(find_info("hip", &hip));
  ASSERT_TRUE(find_info("onednn", &onednn));
  if (cuda.available) {
    EXPECT_STREQ(caps.name, "cuda");
  } else if (hip.available) {
    EXPECT_STREQ(caps.name, "hip");
  } else if (onednn.available) {
    EXPECT_STREQ(caps.name, "onednn");
  } else {
    EXPECT_STREQ(caps.name, "cpu");
  }
  pagedattn_backend_destroy(be);
}

TEST(Backends, CreateWithOptions) {
  pagedattn_backend_options o;
  ASSERT_EQ(pagedattn_backend_options_init(&o), PAGEDATTN_OK);
  o.num_threads = 2;
  pagedattn_backend* be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "cpu", &o), PAGEDATTN_OK) << pagedattn_last_error();
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK);
  EXPECT_EQ(caps.max_num_threads, 2);
  pagedattn_backend_destroy(be);
}

TEST(Backends, CreateRefusals) {
  pagedattn_backend* be = reinterpret_cast<pagedattn_backend*>(0x1);
  pagedattn_backend* const sentinel = be;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "nope", nullptr),
                        PAGEDATTN_ERROR_UNKNOWN_BACKEND, "nope"));
  EXPECT_EQ(be, sentinel);
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "", nullptr),
                        PAGEDATTN_ERROR_UNKNOWN_BACKEND));
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "CPU ", nullptr),
                        PAGEDATTN_ERROR_UNKNOWN_BACKEND));
  EXPECT_TRUE(status_is(pagedattn_backend_create(nullptr, "cpu", nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, nullptr, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  pagedattn_backend_options o;
  pagedattn_backend_options_init(&o);
  o.num_threads = -1;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "cpu", &o), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "thread"));
  pagedattn_backend_options_init(&o);
  o.device_index = -2;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "cpu", &o), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "device"));
  pagedattn_backend_options_init(&o);
  o.flags = 4;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "cpu", &o), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "flags"));
  pagedattn_backend_options_init(&o);
  o.struct_size = 2;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "cpu", &o), PAGEDATTN_ERROR_STRUCT_SIZE));
  pagedattn_backend_options_init(&o);
  o.struct_size = sizeof(o) + 64;  // not a known size
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "cpu", &o), PAGEDATTN_ERROR_STRUCT_SIZE));
  EXPECT_EQ(be, sentinel) << "out written on failure";
}

TEST(Backends, CapabilitiesOfCpu) {
  pagedattn_backend* be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "cpu", nullptr), PAGEDATTN_OK);
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK);
  EXPECT_STREQ(caps.name, "cpu");
  EXPECT_EQ(caps.device.device_type, PAGEDATTN_DEVICE_CPU);
  EXPECT_EQ(caps.device.device_id, 0);
  for (pagedattn_dtype dt :
       {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16, PAGEDATTN_DTYPE_BFLOAT16}) {
    EXPECT_TRUE(caps.dtypes & PAGEDATTN_DTYPE_BIT(dt)) << pagedattn_dtype_name(dt);
    EXPECT_TRUE(caps.cache_dtypes & PAGEDATTN_DTYPE_BIT(dt)) << pagedattn_dtype_name(dt);
  }
  EXPECT_FALSE(caps.dtypes & PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FP8_E4M3)) << "fp8 is cache-only";
  EXPECT_TRUE(caps.cache_dtypes & PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FP8_E4M3));
  EXPECT_TRUE(caps.cache_dtypes & PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FP8_E5M2));
  EXPECT_EQ(caps.layouts, (1u << PAGEDATTN_LAYOUT_NHD) | (1u << PAGEDATTN_LAYOUT_HND));
  EXPECT_EQ(caps.block_sizes, 0x1FFu) << "CPU: every power of two 1..256";
  EXPECT_EQ(caps.head_sizes, 0xFFFFFFFFu) << "CPU: every multiple of 8 up to 256";
  const uint32_t want = PAGEDATTN_FEATURE_ALIBI | PAGEDATTN_FEATURE_SOFT_CAP |
                        PAGEDATTN_FEATURE_SLIDING_WINDOW | PAGEDATTN_FEATURE_CROSS_ATTENTION |
                        PAGEDATTN_FEATURE_ENCODER | PAGEDATTN_FEATURE_FP8_CACHE |
                        PAGEDATTN_FEATURE_LSE | PAGEDATTN_FEATURE_MERGE_STATES |
                        PAGEDATTN_FEATURE_CHUNKED_PREFILL | PAGEDATTN_FEATURE_WRAP_CACHE;
  EXPECT_EQ(caps.features & want, want) << std::hex << caps.features;
  EXPECT_FALSE(caps.features & PAGEDATTN_FEATURE_GRAPH_CAPTURE);
  EXPECT_GE(caps.max_num_threads, 1);
  EXPECT_EQ(caps.total_memory, 0u);

  // A smaller (older) struct_size is filled only up to its size.
  unsigned char raw[sizeof(pagedattn_capabilities) + 16];
  std::memset(raw, 0xEE, sizeof raw);
  pagedattn_capabilities* small = reinterpret_cast<pagedattn_capabilities*>(raw);
  small->struct_size = offsetof(pagedattn_capabilities, features);
  const pagedattn_status st = pagedattn_backend_get_capabilities(small, be);
  if (st == PAGEDATTN_OK) {
    for (size_t i = offsetof(pagedattn_capabilities, features); i < sizeof raw; ++i)
      ASSERT_EQ(raw[i], 0xEE) << "byte " << i << " beyond struct_size written";
  } else {
    EXPECT_EQ(st, PAGEDATTN_ERROR_STRUCT_SIZE);
  }

  EXPECT_TRUE(status_is(pagedattn_backend_get_capabilities(nullptr, be),
                        PAGEDATTN_ERROR_NULL_POINTER));
  caps.struct_size = sizeof caps;
  EXPECT_TRUE(status_is(pagedattn_backend_get_capabilities(&caps, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  caps.struct_size = 0;
  EXPECT_TRUE(status_is(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_ERROR_STRUCT_SIZE));
  EXPECT_TRUE(status_is(pagedattn_backend_synchronize(nullptr, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  pagedattn_backend_destroy(be);
}

// The oneDNN backend hands every item its tiles do not take to the embedded CPU backend, so it
// claims exactly what that backend claims (its own name and thread count aside).
TEST(Backends, CapabilitiesOfOnednnMatchCpu) {
  pagedattn_backend* cpu = nullptr;
  pagedattn_backend* dnn = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&cpu, "cpu", nullptr), PAGEDATTN_OK);
  if (pagedattn_backend_create(&dnn, "onednn", nullptr) != PAGEDATTN_OK) {
    pagedattn_backend_destroy(cpu);
    GTEST_SKIP() << "onednn backend unavailable: " << pagedattn_last_error();
  }
  pagedattn_capabilities c{}, d{};
  c.struct_size = d.struct_size = sizeof c;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&c, cpu), PAGEDATTN_OK);
  ASSERT_EQ(pagedattn_backend_get_capabilities(&d, dnn), PAGEDATTN_OK);
  EXPECT_STREQ(d.name, "onednn");
  EXPECT_EQ(d.device.device_type, c.device.device_type);
  EXPECT_EQ(d.features, c.features) << std::hex << d.features << " vs " << c.features;
  EXPECT_EQ(d.dtypes, c.dtypes);
  EXPECT_EQ(d.cache_dtypes, c.cache_dtypes);
  EXPECT_EQ(d.layouts, c.layouts);
  EXPECT_EQ(d.block_sizes, c.block_sizes);
  EXPECT_EQ(d.head_sizes, c.head_sizes);
  EXPECT_GE(d.max_num_threads, 1);
  EXPECT_EQ(d.total_memory, c.total_memory);
  pagedattn_backend_destroy(dnn);
  pagedattn_backend_destroy(cpu);
}

TEST(Backends, CpuTargetEnvironment) {
  // PAGEDATTN_CPU_TARGET is read at creation: a bogus name must not silently pick something.
  const char* old = std::getenv("PAGEDATTN_CPU_TARGET");
  const std::string saved = old ? old : "";
  setenv("PAGEDATTN_CPU_TARGET", "NOT_A_TARGET", 1);
  pagedattn_backend* be = nullptr;
  const pagedattn_status st = pagedattn_backend_create(&be, "cpu", nullptr);
  if (old) setenv("PAGEDATTN_CPU_TARGET", saved.c_str(), 1); else unsetenv("PAGEDATTN_CPU_TARGET");
  EXPECT_NE(st, PAGEDATTN_OK) << "an unknown PAGEDATTN_CPU_TARGET was accepted";
  EXPECT_TRUE(st == PAGEDATTN_ERROR_UNSUPPORTED || st == PAGEDATTN_ERROR_INVALID_ARGUMENT)
      << pagedattn_status_string(st);
  EXPECT_NE(std::string(pagedattn_last_error()).find("NOT_A_TARGET"), std::string::npos)
      << pagedattn_last_error();
  pagedattn_backend_destroy(st == PAGEDATTN_OK ? be : nullptr);
}

// A variable read when a backend (the suite's, or `backend`) is created: each bad value is
// refused with PAGEDATTN_ERROR_INVALID_ARGUMENT and the variable named, no backend made (*be
// untouched); each good value is taken. The variable is restored after each creation.
static void expect_env_values(const char* var, std::initializer_list<const char*> bad,
                              std::initializer_list<const char*> good,
                              const std::string& backend = pat::backend_name()) {
  const char* old = std::getenv(var);
  const std::string saved = old ? old : "";
  auto create_with = [&](const char* value, pagedattn_backend** be) {
    setenv(var, value, 1);
    const pagedattn_status st = pagedattn_backend_create(be, backend.c_str(), nullptr);
    if (old) setenv(var, saved.c_str(), 1);
    else unsetenv(var);
    return st;
  };
  for (const char* value : bad) {
    pagedattn_backend* be = reinterpret_cast<pagedattn_backend*>(0x1);  // must stay untouched
    const pagedattn_status st = create_with(value, &be);
    EXPECT_TRUE(status_is(st, PAGEDATTN_ERROR_INVALID_ARGUMENT)) << var << "='" << value << "'";
    EXPECT_EQ(be, reinterpret_cast<pagedattn_backend*>(0x1)) << var << "='" << value << "'";
    EXPECT_NE(std::string(pagedattn_last_error()).find(var), std::string::npos)
        << pagedattn_last_error();
  }
  for (const char* value : good) {
    pagedattn_backend* be = nullptr;
    EXPECT_EQ(create_with(value, &be), PAGEDATTN_OK) << var << "=" << value << ": "
                                                     << pagedattn_last_error();
    pagedattn_backend_destroy(be);
  }
}

TEST(Backends, CpuSpinEnvironment) {
  // A whole number of microseconds in 0..1000000.
  expect_env_values("PAGEDATTN_CPU_SPIN_US",
                    {"", "abc", "-1", "1000001", "12us", " 5", "99999999999999999999"},
                    {"0", "1000000", "100"});
}

TEST(Backends, CpuPrefetchEnvironment) {
  // "twice" or "once" (how the decode prefetches the next tile).
  if (pat::backend_name() != "cpu" && pat::backend_name() != "onednn")
    GTEST_SKIP() << "PAGEDATTN_CPU_PREFETCH is read by the cpu and onednn backends only";
  expect_env_values("PAGEDATTN_CPU_PREFETCH", {"", "Twice", "2", "once ", "never"},
                    {"twice", "once"});
}

TEST(Backends, OnednnEnvironment) {
  // PAGEDATTN_ONEDNN_BF16: 0 or 1; PAGEDATTN_ONEDNN_MIN_QUERY: a whole number in 1..65536.
  pagedattn_backend* dnn = nullptr;
  if (pagedattn_backend_create(&dnn, "onednn", nullptr) != PAGEDATTN_OK)
    GTEST_SKIP() << "skipped: onednn backend unavailable: " << pagedattn_last_error();
  pagedattn_backend_destroy(dnn);
  expect_env_values("PAGEDATTN_ONEDNN_BF16", {"", "yes", "2", "0 ", "true"}, {"0", "1"},
                    "onednn");
  expect_env_values("PAGEDATTN_ONEDNN_MIN_QUERY", {"", "0", "-4", "16x", "65537", " 8"},
                    {"1", "16", "65536"}, "onednn");
}

// A step whose oneDNN tiles would be float32 (no native bf16 matmul, or float32 inputs as here)
// runs on the embedded cpu kernels unless float32 tiles are asked for (the cpu kernels are as
// fast or faster): by default the output is the cpu backend's to the bit, so the error against
// float64 is the same number; with PAGEDATTN_ONEDNN_MIN_QUERY set the tiles run and round
// differently.
TEST(Backends, OnednnRunsFloat32TileStepsOnTheCpuKernels) {
  const char* old = std::getenv("PAGEDATTN_ONEDNN_MIN_QUERY");
  const std::string saved = old ? old : "";
  unsetenv("PAGEDATTN_ONEDNN_MIN_QUERY");
  pagedattn_backend_options o;
  ASSERT_EQ(pagedattn_backend_options_init(&o), PAGEDATTN_OK);
  o.num_threads = 2;
  pagedattn_backend *cpu = nullptr, *dnn = nullptr, *tiles = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&cpu, "cpu", &o), PAGEDATTN_OK) << pagedattn_last_error();
  const pagedattn_status st = pagedattn_backend_create(&dnn, "onednn", &o);
  setenv("PAGEDATTN_ONEDNN_MIN_QUERY", "16", 1);
  if (st == PAGEDATTN_OK) {
    EXPECT_EQ(pagedattn_backend_create(&tiles, "onednn", &o), PAGEDATTN_OK)
        << pagedattn_last_error();
  }
  if (old) setenv("PAGEDATTN_ONEDNN_MIN_QUERY", saved.c_str(), 1);
  else unsetenv("PAGEDATTN_ONEDNN_MIN_QUERY");
  if (st != PAGEDATTN_OK) {
    pagedattn_backend_destroy(cpu);
    GTEST_SKIP() << "skipped: onednn backend unavailable: " << pagedattn_last_error();
  }
  pat::AttnCase c;
  c.dtype = PAGEDATTN_DTYPE_FLOAT32;  // float32 outputs show the order of the sums
  c.H = 8;
  c.Hkv = 2;
  c.D = 64;
  c.seqs = {{64, 0}, {40, 24}, {1, 50}};
  const uint64_t seed = 20261127;
  pat::CaseResult rc, rd, rt;
  EXPECT_TRUE(pat::run_attention_case(cpu, c, seed, &rc));
  EXPECT_TRUE(pat::run_attention_case(dnn, c, seed, &rd));
  EXPECT_EQ(rd.err, rc.err) << "the default onednn backend did not run the cpu kernels";
  if (tiles != nullptr) {
    EXPECT_TRUE(pat::run_attention_case(tiles, c, seed, &rt));
    EXPECT_NE(rt.err, rc.err) << "PAGEDATTN_ONEDNN_MIN_QUERY=16 did not run the float32 tiles";
  }
  pagedattn_backend_destroy(tiles);
  pagedattn_backend_destroy(dnn);
  pagedattn_backend_destroy(cpu);
}

TEST(Backends, DestroyOrderIsSafe) {
  // Destroying the backend before its caches and batches must not crash (refcounted).
  pagedattn_backend* be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "cpu", nullptr), PAGEDATTN_OK);
  pagedattn_kv_cache_desc d;
  pagedattn_kv_cache_desc_init(&d);
  d.num_layers = 1;
  d.num_blocks = 4;
  d.block_size = 16;
  d.num_kv_heads = 2;
  d.head_size = 64;
  d.dtype = PAGEDATTN_DTYPE_FLOAT32;
  pagedattn_kv_cache* c = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
  const int32_t ql[1] = {3}, cl[1] = {0}, tab[1] = {2};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = 1;
  bd.query_lens = ql;
  bd.context_lens = cl;
  bd.block_tables = tab;
  bd.block_table_stride = 1;
  pagedattn_batch* b = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&b, be, c, nullptr, &bd), PAGEDATTN_OK) << pagedattn_last_error();
  pagedattn_backend_destroy(be);
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  EXPECT_EQ(pagedattn_batch_get_info(&info, b), PAGEDATTN_OK);
  pagedattn_kv_cache_desc got;
  pagedattn_kv_cache_desc_init(&got);
  EXPECT_EQ(pagedattn_kv_cache_get_desc(&got, c), PAGEDATTN_OK);
  pagedattn_batch_destroy(b);
  pagedattn_kv_cache_destroy(c);
}
