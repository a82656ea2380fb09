// API basics: versions, status strings, the thread-local last error, dtype helpers, inits.
#include <cstring>
#include <vector>
#include <string>
#include <thread>

#include "pagedattn_test_support.h"

using pat::status_is;

TEST(Version, MacrosMatchRuntime) {
  int32_t ma = -1, mi = -1, pa = -1;
  const int32_t n = pagedattn_version(&ma, &mi, &pa);
  EXPECT_EQ(ma, PAGEDATTN_VERSION_MAJOR);
  EXPECT_EQ(mi, PAGEDATTN_VERSION_MINOR);
  EXPECT_EQ(pa, PAGEDATTN_VERSION_PATCH);
  EXPECT_EQ(n, PAGEDATTN_VERSION_NUMBER);
  EXPECT_EQ(n, ma * 10000 + mi * 100 + pa);
  EXPECT_EQ(pagedattn_version(nullptr, nullptr, nullptr), n);
  ASSERT_NE(pagedattn_version_string(), nullptr);
  EXPECT_STREQ(pagedattn_version_string(), PAGEDATTN_VERSION_STRING);
  const std::string s = std::to_string(ma) + "." + std::to_string(mi) + "." + std::to_string(pa);
  EXPECT_EQ(s, pagedattn_version_string());
}

TEST(Status, StringForEveryCode) {
  struct {
    pagedattn_status st;
    const char* name;
  } const all[] = {
      {PAGEDATTN_OK, "PAGEDATTN_OK"},
      {PAGEDATTN_ERROR_INVALID_ARGUMENT, "PAGEDATTN_ERROR_INVALID_ARGUMENT"},
      {PAGEDATTN_ERROR_NULL_POINTER, "PAGEDATTN_ERROR_NULL_POINTER"},
      {PAGEDATTN_ERROR_STRUCT_SIZE, "PAGEDATTN_ERROR_STRUCT_SIZE"},
      {PAGEDATTN_ERROR_BAD_TENSOR, "PAGEDATTN_ERROR_BAD_TENSOR"},
      {PAGEDATTN_ERROR_WRONG_DEVICE, "PAGEDATTN_ERROR_WRONG_DEVICE"},
      {PAGEDATTN_ERROR_OUT_OF_RANGE, "PAGEDATTN_ERROR_OUT_OF_RANGE"},
      {PAGEDATTN_ERROR_OVERFLOW, "PAGEDATTN_ERROR_OVERFLOW"},
      {PAGEDATTN_ERROR_UNSUPPORTED, "PAGEDATTN_ERROR_UNSUPPORTED"},
      {PAGEDATTN_ERROR_CAPACITY, "PAGEDATTN_ERROR_CAPACITY"},
      {PAGEDATTN_ERROR_OUT_OF_MEMORY, "PAGEDATTN_ERROR_OUT_OF_MEMORY"},
      {PAGEDATTN_ERROR_UNKNOWN_BACKEND, "PAGEDATTN_ERROR_UNKNOWN_BACKEND"},
      {PAGEDATTN_ERROR_BACKEND_UNAVAILABLE, "PAGEDATTN_ERROR_BACKEND_UNAVAILABLE"},
      {PAGEDATTN_ERROR_PLUGIN, "PAGEDATTN_ERROR_PLUGIN"},
      {PAGEDATTN_ERROR_PLUGIN_ABI, "PAGEDATTN_ERROR_PLUGIN_ABI"},
      {PAGEDATTN_ERROR_DEVICE, "PAGEDATTN_ERROR_DEVICE"},
      {PAGEDATTN_ERROR_INVALID_HANDLE, "PAGEDATTN_ERROR_INVALID_HANDLE"},
      {PAGEDATTN_ERROR_INTERNAL, "PAGEDATTN_ERROR_INTERNAL"},
  };
  int expect_value = 0;
  for (const auto& e : all) {
    EXPECT_EQ(static_cast<int>(e.st), expect_value++) << e.name << " value is pinned";
    ASSERT_NE(pagedattn_status_string(e.st), nullptr);
    EXPECT_STREQ(pagedattn_status_string(e.st), e.name);
  }
  for (int bad : {-1, 18, 1000}) {
    ASSERT_NE(pagedattn_status_string(static_cast<pagedattn_status>(bad)), nullptr);
    EXPECT_STREQ(pagedattn_status_string(static_cast<pagedattn_status>(bad)),
                 "PAGEDATTN_STATUS_UNKNOWN");
  }
}

TEST(LastError, SetOnFailureResetOnSuccess) {
  ASSERT_NE(pagedattn_last_error(), nullptr);
  EXPECT_TRUE(status_is(pagedattn_backend_options_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_STRNE(pagedattn_last_error(), "");
  pagedattn_backend_options o;
  EXPECT_EQ(pagedattn_backend_options_init(&o), PAGEDATTN_OK);
  EXPECT_STREQ(pagedattn_last_error(), "") << "a successful call must reset the message";

  pagedattn_backend* be = nullptr;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "no-such-backend", nullptr),
                        PAGEDATTN_ERROR_UNKNOWN_BACKEND, "no-such-backend"));
  EXPECT_EQ(be, nullptr) << "out-parameter must stay untouched on failure";
  uint64_t bytes = 0;
  pagedattn_kv_cache_desc d;
  ASSERT_EQ(pagedattn_kv_cache_desc_init(&d), PAGEDATTN_OK);
  d.num_layers = 1;
  d.num_blocks = 1;
  d.block_size = 16;
  d.num_kv_heads = 1;
  d.head_size = 64;
  EXPECT_EQ(pagedattn_kv_cache_bytes_per_block(&bytes, &d), PAGEDATTN_OK);
  EXPECT_STREQ(pagedattn_last_error(), "");
}

TEST(LastError, IsThreadLocal) {
  EXPECT_NE(pagedattn_backend_options_init(nullptr), PAGEDATTN_OK);
  const std::string here = pagedattn_last_error();
  ASSERT_FALSE(here.empty());
  std::string there = "unset";
  std::thread th([&] {
    there = pagedattn_last_error();  // fresh thread: nothing failed yet
    pagedattn_backend* be = nullptr;
    (void)pagedattn_backend_create(&be, "another-unknown-name", nullptr);
  });
  th.join();
  EXPECT_EQ(there, "");
  EXPECT_EQ(here, pagedattn_last_error()) << "another thread's failure changed this thread's error";
}

TEST(Dtype, NamesAndSizes) {
  EXPECT_STREQ(pagedattn_dtype_name(PAGEDATTN_DTYPE_FLOAT32), "float32");
  EXPECT_STREQ(pagedattn_dtype_name(PAGEDATTN_DTYPE_FLOAT16), "float16");
  EXPECT_STREQ(pagedattn_dtype_name(PAGEDATTN_DTYPE_BFLOAT16), "bfloat16");
  EXPECT_STREQ(pagedattn_dtype_name(PAGEDATTN_DTYPE_FP8_E4M3), "fp8_e4m3");
  EXPECT_STREQ(pagedattn_dtype_name(PAGEDATTN_DTYPE_FP8_E5M2), "fp8_e5m2");
  EXPECT_STREQ(pagedattn_dtype_name(PAGEDATTN_DTYPE_INVALID), "invalid");
  EXPECT_STREQ(pagedattn_dtype_name(static_cast<pagedattn_dtype>(77)), "invalid");
  EXPECT_EQ(pagedattn_dtype_size(PAGEDATTN_DTYPE_FLOAT32), 4u);
  EXPECT_EQ(pagedattn_dtype_size(PAGEDATTN_DTYPE_FLOAT16), 2u);
  EXPECT_EQ(pagedattn_dtype_size(PAGEDATTN_DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(pagedattn_dtype_size(PAGEDATTN_DTYPE_FP8_E4M3), 1u);
  EXPECT_EQ(pagedattn_dtype_size(PAGEDATTN_DTYPE_FP8_E5M2), 1u);
  EXPECT_EQ(pagedattn_dtype_size(PAGEDATTN_DTYPE_INVALID), 0u);
  EXPECT_EQ(pagedattn_dtype_size(static_cast<pagedattn_dtype>(-3)), 0u);
  EXPECT_EQ(PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_BFLOAT16), 8u);
}

TEST(Dtype, DlpackRoundTrip) {
  const pagedattn_dtype all[] = {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16,
                                 PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_FP8_E4M3,
                                 PAGEDATTN_DTYPE_FP8_E5M2};
  for (pagedattn_dtype dt : all) {
    pagedattn_dlpack_dtype d{};
    ASSERT_EQ(pagedattn_dtype_to_dlpack(&d, dt), PAGEDATTN_OK) << pagedattn_dtype_name(dt);
    const pagedattn_dlpack_dtype want = pat::dlpack_of(dt);
    EXPECT_EQ(d.code, want.code) << pagedattn_dtype_name(dt);
    EXPECT_EQ(d.bits, want.bits) << pagedattn_dtype_name(dt);
    EXPECT_EQ(d.lanes, 1);
    pagedattn_dtype back = PAGEDATTN_DTYPE_INVALID;
    ASSERT_EQ(pagedattn_dtype_from_dlpack(&back, d), PAGEDATTN_OK);
    EXPECT_EQ(back, dt);
  }
}

TEST(Dtype, DlpackRefusals) {
  pagedattn_dlpack_dtype d{};
  EXPECT_TRUE(status_is(pagedattn_dtype_to_dlpack(&d, PAGEDATTN_DTYPE_INVALID),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT));
  EXPECT_TRUE(status_is(pagedattn_dtype_to_dlpack(&d, static_cast<pagedattn_dtype>(99)),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT));
  EXPECT_TRUE(status_is(pagedattn_dtype_to_dlpack(nullptr, PAGEDATTN_DTYPE_FLOAT32),
                        PAGEDATTN_ERROR_NULL_POINTER));
  pagedattn_dtype out = PAGEDATTN_DTYPE_FLOAT16;
  EXPECT_TRUE(status_is(pagedattn_dtype_from_dlpack(nullptr, pat::dlpack_of(PAGEDATTN_DTYPE_FLOAT32)),
                        PAGEDATTN_ERROR_NULL_POINTER));
  const pagedattn_dlpack_dtype bad[] = {
      {PAGEDATTN_DLPACK_INT, 32, 1},   {PAGEDATTN_DLPACK_FLOAT, 64, 1},
      {PAGEDATTN_DLPACK_FLOAT, 32, 4}, {PAGEDATTN_DLPACK_BFLOAT, 32, 1},
      {7, 16, 1},
  };
  for (const auto& b : bad) {
    EXPECT_TRUE(status_is(pagedattn_dtype_from_dlpack(&out, b), PAGEDATTN_ERROR_UNSUPPORTED))
        << "code " << int(b.code) << " bits " << int(b.bits) << " lanes " << b.lanes;
    EXPECT_EQ(out, PAGEDATTN_DTYPE_FLOAT16) << "out-parameter written on failure";
  }
}

TEST(Inits, DefaultsAndStructSize) {
  pagedattn_backend_options bo;
  std::memset(&bo, 0xAB, sizeof bo);
  ASSERT_EQ(pagedattn_backend_options_init(&bo), PAGEDATTN_OK);
  EXPECT_EQ(bo.struct_size, sizeof bo);
  EXPECT_EQ(bo.device_index, 0);
  EXPECT_EQ(bo.num_threads, 0);
  EXPECT_EQ(bo.flags, 0u);
  EXPECT_EQ(bo.memory_limit, 0u);

  pagedattn_kv_cache_desc cd;
  std::memset(&cd, 0xAB, sizeof cd);
  ASSERT_EQ(pagedattn_kv_cache_desc_init(&cd), PAGEDATTN_OK);
  EXPECT_EQ(cd.struct_size, sizeof cd);
  EXPECT_EQ(cd.layout, PAGEDATTN_LAYOUT_NHD);
  EXPECT_EQ(cd.dtype, PAGEDATTN_DTYPE_BFLOAT16);
  EXPECT_EQ(cd.num_layers, 0);
  EXPECT_EQ(cd.flags, 0u);

  pagedattn_batch_desc bd;
  std::memset(&bd, 0xAB, sizeof bd);
  ASSERT_EQ(pagedattn_batch_desc_init(&bd), PAGEDATTN_OK);
  // The 0.1 layout (batch.h): an older caller's struct is never written past its end.
  EXPECT_EQ(bd.struct_size, offsetof(pagedattn_batch_desc, lens_form));
  EXPECT_EQ(bd.num_seqs, 0);
  EXPECT_EQ(bd.query_lens, nullptr);
  EXPECT_EQ(bd.slot_mapping, nullptr);
  EXPECT_EQ(bd.max_seq_len, 0);

  pagedattn_attention_options ao;
  std::memset(&ao, 0xAB, sizeof ao);
  ASSERT_EQ(pagedattn_attention_options_init(&ao), PAGEDATTN_OK);
  // The 0.1 layout (attention.h), as for the batch desc.
  EXPECT_EQ(ao.struct_size, offsetof(pagedattn_attention_options, sinks));
  EXPECT_EQ(ao.scale, 0.0f);
  EXPECT_EQ(ao.soft_cap, 0.0f);
  EXPECT_EQ(ao.sliding_window, 0);
  EXPECT_EQ(ao.attention_type, PAGEDATTN_ATTENTION_DECODER);
  EXPECT_EQ(ao.write_kv, 1);
  EXPECT_EQ(ao.k_scale, 1.0f);
  EXPECT_EQ(ao.v_scale, 1.0f);
  EXPECT_EQ(ao.alibi_slopes, nullptr);
  EXPECT_EQ(ao.flags, 0u);

  EXPECT_TRUE(status_is(pagedattn_kv_cache_desc_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(pagedattn_batch_desc_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(pagedattn_attention_options_init(nullptr), PAGEDATTN_ERROR_NULL_POINTER));
}

TEST(Inits, AttentionOptionsSizes) {
  // pagedattn_attention_options_init fills the 0.1 layout only (never past an old caller's
  // struct); init_sized fills what it is told, the later fields off.
  const size_t v01 = offsetof(pagedattn_attention_options, sinks);
  std::vector<uint8_t> mem(sizeof(pagedattn_attention_options) + 8, 0xAB);
  auto* o = reinterpret_cast<pagedattn_attention_options*>(mem.data());
  ASSERT_EQ(pagedattn_attention_options_init(o), PAGEDATTN_OK);
  EXPECT_EQ(o->struct_size, v01);
  EXPECT_EQ(o->k_scale, 1.0f);
  for (size_t i = v01; i < mem.size(); ++i)
    ASSERT_EQ(mem[i], 0xAB) << "options_init wrote byte " << i << " past the 0.1 layout";
  std::fill(mem.begin(), mem.end(), 0xAB);
  ASSERT_EQ(pagedattn_attention_options_init_sized(o, sizeof *o), PAGEDATTN_OK);
  EXPECT_EQ(o->struct_size, sizeof *o);
  EXPECT_EQ(o->write_kv, 1);
  EXPECT_EQ(o->v_scale, 1.0f);
  EXPECT_EQ(o->sinks, nullptr);
  EXPECT_EQ(o->attention_chunk, 0);
  EXPECT_EQ(o->k_head_scales, nullptr);
  EXPECT_EQ(o->v_head_scales, nullptr);
  for (size_t i = sizeof *o; i < mem.size(); ++i) EXPECT_EQ(mem[i], 0xAB) << "byte " << i;
  EXPECT_TRUE(status_is(pagedattn_attention_options_init_sized(o, 8), PAGEDATTN_ERROR_STRUCT_SIZE,
                        "opts->struct_size = 8"));
  EXPECT_TRUE(status_is(pagedattn_attention_options_init_sized(o, sizeof *o + 8),
                        PAGEDATTN_ERROR_STRUCT_SIZE, "is not a known size"));
  // Between the two layouts: it would cut the sinks pointer short.
  EXPECT_TRUE(status_is(pagedattn_attention_options_init_sized(o, static_cast<uint32_t>(v01 + 4)),
                        PAGEDATTN_ERROR_STRUCT_SIZE, "is not a known size"));
  EXPECT_TRUE(status_is(pagedattn_attention_options_init_sized(nullptr, sizeof *o),
                        PAGEDATTN_ERROR_NULL_POINTER, "opts is NULL"));
}

TEST(Destroy, NullIsNoOp) {
  pagedattn_backend_destroy(nullptr);
  pagedattn_kv_cache_destroy(nullptr);
  pagedattn_batch_destroy(nullptr);
  SUCCEED();
}

// Our own conversions (the reference's) against known encodings.
TEST(TestSupport, Conversions) {
  EXPECT_EQ(pat::f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(pat::f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(pat::f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(pat::f32_to_f16(5.9604645e-8f), 0x0001);
  EXPECT_EQ(pat::f32_to_f16(1.0f + 1.0f / 2048), 0x3C00);  // tie to even
  EXPECT_EQ(pat::f32_to_f16(1.0f + 3.0f / 2048), 0x3C02);
  EXPECT_EQ(pat::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(pat::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(pat::f32_to_bf16(1.00390625f), 0x3F80);  // tie to even
  EXPECT_EQ(pat::f32_to_bf16(1.01171875f), 0x3F82);
  EXPECT_EQ(pat::e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(pat::f32_to_e4m3(1000.0f), 0x7E);   // saturates
  EXPECT_EQ(pat::f32_to_e4m3(-1000.0f), 0xFE);
  EXPECT_EQ(pat::f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(pat::e4m3_to_f32(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(pat::f32_to_e4m3(1.0625f), 0x38);       // tie 1.0 / 1.125 -> even
  EXPECT_EQ(pat::f32_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(pat::f32_to_e5m2(1e9f), 0x7B);
  EXPECT_EQ(pat::e5m2_to_f32(0x3C), 1.0f);
  EXPECT_EQ(pat::e5m2_to_f32(0x01), 1.52587890625e-05f);  // 2^-16
}
