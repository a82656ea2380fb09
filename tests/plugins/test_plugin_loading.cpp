// Plugin loader failures, one scenario per process (meson runs each with its own
// PAGEDATTN_PLUGIN_PATH): the status, a message naming the file, and the rest still working.
#include <dlfcn.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

const char kFile[] = "libpagedattn-onednn.so";

std::string plugin_dir() {
  const char* p = std::getenv("PAGEDATTN_PLUGIN_PATH");
  return p ? p : "";
}

// A broken plugin breaks nothing else: cpu works, and auto picks another backend.
// Creates backend `request` and returns the name its capabilities report ("" with a failure
// recorded if it cannot be created or queried).
std::string created_name(const char* request) {
  pagedattn_backend* be = nullptr;
  EXPECT_EQ(pagedattn_backend_create(&be, request, nullptr), PAGEDATTN_OK)
      << request << ": " << pat::last_error();
  if (be == nullptr) return "";
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof caps;
  EXPECT_EQ(pagedattn_backend_get_capabilities(&caps, be), PAGEDATTN_OK) << pat::last_error();
  std::string name = caps.name != nullptr ? caps.name : "";
  pagedattn_backend_destroy(be);
  return name;
}

void expect_others_work() {
  EXPECT_EQ(created_name("cpu"), "cpu");
  const std::string picked = created_name("auto");
  EXPECT_FALSE(picked.empty());
  EXPECT_NE(picked, "onednn");
}

// True if `text` contains `needle`; says which it lacks otherwise.
::testing::AssertionResult mentions(const std::string& what, const std::string& text,
                                    const std::string& needle) {
  if (text.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " \"" << text << "\" does not mention \"" << needle
                                       << "\"";
}

// Loads "onednn" through the scenario's directory and checks the refusal and that its message
// (and the listing's reason) contains every needle.
void expect_onednn_refused(pagedattn_status want, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(plugin_dir().empty()) << "run through meson: PAGEDATTN_PLUGIN_PATH is not set";
  pagedattn_backend* be = nullptr;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr), want));
  const std::string msg = pat::last_error();
  for (const std::string& n : needles) EXPECT_TRUE(mentions("message", msg, n));
  EXPECT_EQ(be, nullptr);
  // The listing says the same, and a second attempt (cached result) still refuses.
  const int32_t count = pagedattn_backend_count();
  bool seen = false;
  for (int32_t i = 0; i < count; ++i) {
    pagedattn_backend_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(pagedattn_backend_get_info(&info, i), PAGEDATTN_OK);
    if (std::strcmp(info.name, "onednn") != 0) continue;
    seen = true;
    EXPECT_EQ(info.available, 0);
    for (const std::string& n : needles) EXPECT_TRUE(mentions("reason", info.reason, n));
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr), want));
  EXPECT_EQ(pat::last_error(), msg) << "a second attempt says something else";
  expect_others_work();
}

// The message names the file: its name and the directory it was found in.
std::string file_in_dir() { return plugin_dir() + "/" + kFile; }

}  // namespace

TEST(Plugin, wrong_abi) {
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN_ABI, {file_in_dir(), "plugin ABI"});
}

TEST(Plugin, missing_ops_symbol) {
  pagedattn_backend* be = nullptr;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr), PAGEDATTN_ERROR_PLUGIN,
                        "pagedattn_plugin_ops"))
      << "the message should name the missing symbol";
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, {file_in_dir()});
}

TEST(Plugin, probe_fails) {
  // The plugin's reason, and which file said it.
  expect_onednn_refused(PAGEDATTN_ERROR_BACKEND_UNAVAILABLE,
                        {file_in_dir(), "probe of device 0",
                         "fake probe: no accelerator attached (pagedattn test plugin)"});
}

TEST(Plugin, create_fails) {
  // The probe succeeds, so the listing calls it available; create fails with the plugin's own
  // status and reason, named with the file, and the core keeps nothing of the attempt.
  ASSERT_FALSE(plugin_dir().empty()) << "run through meson: PAGEDATTN_PLUGIN_PATH is not set";
  const std::string reason = "fake create: cannot reserve the device pool (pagedattn test plugin)";
  pagedattn_backend* be = nullptr;
  EXPECT_TRUE(status_is(pagedattn_backend_create(&be, "onednn", nullptr),
                        PAGEDATTN_ERROR_OUT_OF_MEMORY));
  const std::string msg = pat::last_error();
  EXPECT_TRUE(mentions("message", msg, file_in_dir()));
  EXPECT_TRUE(mentions("message", msg, "create failed"));
  EXPECT_TRUE(mentions("message", msg, reason));
  EXPECT_EQ(msg.find("onednn: onednn"), std::string::npos) << msg;
  EXPECT_EQ(be, nullptr);

  // Nothing leaks: the heap in use does not grow over many failed creates (one leaked handle
  // per attempt would be 200 x sizeof(pagedattn_backend)). Under ASan, mallinfo2 reads zero and
  // LeakSanitizer checks the same at exit.
  const size_t before = mallinfo2().uordblks;
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    pagedattn_backend* b = nullptr;
    if (pagedattn_backend_create(&b, "onednn", nullptr) == PAGEDATTN_ERROR_OUT_OF_MEMORY &&
        b == nullptr)
      ++refused;
  }
  const size_t after = mallinfo2().uordblks;
  EXPECT_EQ(refused, 200);
  EXPECT_LT(after, before + 1024) << "heap in use grew from " << before << " to " << after
                                  << " bytes over 200 failed creates";
  EXPECT_EQ(pat::last_error(), msg) << "a later attempt says something else";

  // The plugin saw every create and no destroy of the state a failed create left behind.
  void* h = dlopen(file_in_dir().c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr) << "the plugin is not loaded: " << dlerror();
  auto calls = reinterpret_cast<void (*)(int32_t*, int32_t*)>(dlsym(h, "fake_plugin_calls"));
  ASSERT_NE(calls, nullptr);
  int32_t creates = -1, destroys = -1;
  calls(&creates, &destroys);
  EXPECT_EQ(creates, 201);
  EXPECT_EQ(destroys, 0) << "the core destroyed the state of a failed create";
  dlclose(h);

  pagedattn_backend_info info{};
  info.struct_size = sizeof info;
  for (int32_t i = 0; i < pagedattn_backend_count(); ++i) {
    ASSERT_EQ(pagedattn_backend_get_info(&info, i), PAGEDATTN_OK);
    if (std::strcmp(info.name, "onednn") == 0) break;
  }
  ASSERT_STREQ(info.name, "onednn");
  EXPECT_EQ(info.available, 1) << info.reason;
  expect_others_work();
  calls(&creates, &destroys);  // auto tried onednn once more
  EXPECT_EQ(destroys, 0);
}

TEST(Plugin, not_an_elf) {
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, {file_in_dir()});
}

TEST(Plugin, truncated_elf) {
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, {file_in_dir()});
}

TEST(Plugin, missing_plugin) {
  // Not in the path, not beside the core (the build tree keeps plugins elsewhere).
  expect_onednn_refused(PAGEDATTN_ERROR_PLUGIN, {kFile, "not found", plugin_dir()});
}

TEST(Plugin, search_path_list) {
  // The first directory does not exist; the real plugin sits in the second.
  EXPECT_EQ(created_name("onednn"), "onednn");
}
