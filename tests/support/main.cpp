// gtest main for pagedattn's suites: like gtest_main, but exits 77 (meson's "skipped") when every
// test that ran was skipped, so a run without a GPU or SIMD target shows as SKIP, not OK; and
// fails when a --gtest_filter matched nothing, so a mistyped filter cannot pass silently.
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest* u = ::testing::UnitTest::GetInstance();
  if (u->test_to_run_count() == 0) {
    std::fprintf(stderr, "no test matched the filter\n");
    return 1;
  }
  if (rc == 0 && u->skipped_test_count() == u->test_to_run_count()) return 77;
  return rc;
}
