// CUDA errors as Status values (host code of the kernels' launchers).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace flashq {

inline Status CudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::Ok();
  return Internal(std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace flashq

#define FQ_CUDA_RETURN(call) FQ_RETURN_IF_ERROR(::flashq::CudaStatus((call), #call))
// After a kernel launch: reports a bad launch configuration at once.
#define FQ_CUDA_RETURN_LAUNCH() FQ_RETURN_IF_ERROR(::flashq::CudaStatus(cudaGetLastError(), "kernel launch"))
