// main() of the CUDA backend's GPU tests: with no GPU visible the whole binary is skipped, and
// says so with exit code 77 (ctest's SKIP_RETURN_CODE), rather than passing tests that ran
// nothing.
#include <gtest/gtest.h>

#include <cstdio>

#include "server/backends/cuda/cuda_backend.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (flashq::server::CudaDeviceCount() == 0) {
    std::printf("no GPU visible: the CUDA backend tests are skipped\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
