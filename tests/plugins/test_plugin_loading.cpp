// Plugin loader failures, one scenario per process (meson runs each with its own
// PAGEDATTN_PLUGIN_PATH): the status, a message naming the file, and the rest still working.
#include <cstdlib>
#include <cstring>
#include <string>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

const char kFile[] = "libpagedattn-onednn.so";

std::string plugin_dir() {
  const char* p = std::getenv("PAGEDATTN_PLUGIN_PATH");
  return p ? p : "";
}

// Loads "onednn" through the scenario's directory and checks the refusal and its message.
void expect_onednn_refused(pagedattn_status want, const std::string& needle) {
  ASSERT_FALSE(plugin_dir().empty()) << "run through meson: PAGEDATTN_PLUGIN_PATH is not set";
  pagedattn_backend* be = nullptr;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr), want, needle));
  EXPECT_EQ(be, nullptr);
  // The listing says the same, and a second attempt (cached result) still refuses.
  const int32_t n = pagedattn_backend_count();
  bool seen = false;
  for (int32_t i = 0; i < n; ++i) {
    pagedattn_backend_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(pagedattn_backend_get_info(&info, i), PAGEDATTN_OK);
    if (std::strcmp(info.name, "onednn") != 0) continue;
    seen = true;
    EXPECT_EQ(info.available, 0);
    EXPECT_NE(std::string(info.reason).find(needle), std::string::npos)
        << "reason \"" << info.reason << "\" does not mention \"" << needle << "\"";
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr), want, needle));
  // A broken plugin breaks nothing else.
  ASSERT_EQ(pagedattn_backend_create(&be, "cpu", nullptr), PAGEDATTN_OK) << pat::last_error();
  pagedattn_backend_destroy(be);
  be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "auto", nullptr), PAGEDATTN_OK) << pat::last_error();
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK);
  EXPECT_STRNE(caps.name, "onednn");
  pagedattn_backend_destroy(be);
}

// The message names the file: its name and the directory it was found in.
std::string file_in_dir() { return plugin_dir() + "/" + kFile; }

}  // namespace

TEST(Plugin, wrong_abi) {
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN_ABI, file_in_dir());
}

TEST(Plugin, missing_ops_symbol) {
  pagedattn_backend* be = nullptr;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr), PAGEDATTN_ERROR_PLUGIN,
                        "pagedattn_plugin_ops"))
      << "the message should name the missing symbol";
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, file_in_dir());
}

TEST(Plugin, probe_fails) {
  expect_onednn_refused(PAGEDATTN_ERROR_BACKEND_UNAVAILABLE,
                        "fake probe: no accelerator attached (pagedattn test plugin)");
}

TEST(Plugin, not_an_elf) {
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, file_in_dir());
}

TEST(Plugin, truncated_elf) {
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, file_in_dir());
}

TEST(Plugin, missing_plugin) {
  // Not in the path, not beside the core (the build tree keeps plugins elsewhere).
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, kFile);
}

TEST(Plugin, search_path_list) {
  // The first directory does not exist; the real plugin sits in the second.
  pagedattn_backend* be = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be, "onednn", nullptr), PAGEDATTN_OK) << pat::last_error();
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK);
  EXPECT_STREQ(caps.name, "onednn");
  pagedattn_backend_destroy(be);
}
