// main() of every GPU test binary: with no GPU visible the whole binary is skipped, and says so
// with exit code 77 (ctest's SKIP_RETURN_CODE), rather than passing tests that ran nothing.
// Listing the tests (ctest's discovery) works everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int n = 0;
  if (!::testing::GTEST_FLAG(list_tests) && (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)) {
    std::printf("no GPU visible: %s is skipped\n", argv[0]);
    return 77;
  }
  return RUN_ALL_TESTS();
}
