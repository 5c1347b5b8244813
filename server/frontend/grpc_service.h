// inference.GRPCInferenceService (KServe v2 + Triton extensions) on gRPC's
// callback API: no thread waits while a request sits in a queue or on a GPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>

#include "grpc_service.grpc.pb.h"
#include "server/inference_server.h"
#include "server/core/shared_memory.h"
#include "server/frontend/auth.h"

namespace flashq::server {

// Per ModelStreamInfer call: the server stops reading a stream's requests while it holds
// `max_answers` of them unanswered (queued, computing or waiting to be written), or while its
// answers waiting to be written, plus those still computing counted at the largest answer the
// stream has produced, reach `max_bytes`. With nothing unanswered it always reads one more. A
// client that stops reading then stalls in HTTP/2 flow control instead of filling server
// memory. A client that writes all its requests before reading any can have that many (plus
// what the HTTP/2 window holds) outstanding before its writes block.
struct StreamLimits {
  int64_t max_answers = 128;
  int64_t max_bytes = int64_t(32) << 20;
};

// The generated CallbackService with ModelInfer and ModelStreamInfer on gRPC's raw byte
// buffers (infer_codec.h), so that tensors' bytes are not copied by protobuf; every other RPC
// is typed. The chain is CallbackService's with those two links swapped (a raw streaming method
// cannot override a typed one).
namespace grpc_base {
using G = inference::GRPCInferenceService;
using Service = G::WithCallbackMethod_ServerLive<G::WithCallbackMethod_ServerReady<G::WithCallbackMethod_ModelReady<
    G::WithCallbackMethod_ServerMetadata<G::WithCallbackMethod_ModelMetadata<G::WithRawCallbackMethod_ModelInfer<
        G::WithRawCallbackMethod_ModelStreamInfer<G::WithCallbackMethod_ModelConfig<G::WithCallbackMethod_ModelStatistics<
            G::WithCallbackMethod_SystemSharedMemoryStatus<G::WithCallbackMethod_SystemSharedMemoryRegister<
                G::WithCallbackMethod_SystemSharedMemoryUnregister<G::WithCallbackMethod_CudaSharedMemoryStatus<
                    G::WithCallbackMethod_CudaSharedMemoryRegister<G::WithCallbackMethod_CudaSharedMemoryUnregister<
                        G::WithCallbackMethod_RepositoryIndex<G::WithCallbackMethod_RepositoryModelLoad<
                            G::WithCallbackMethod_RepositoryModelUnload<G::Service>>>>>>>>>>>>>>>>>>;
}  // namespace grpc_base

class GrpcInferenceService final : public grpc_base::Service {
 public:
  explicit GrpcInferenceService(std::string version) : version_(std::move(version)) {}

  // Until models are loaded the service is live but not ready, and inference gets UNAVAILABLE.
  void SetServer(InferenceServer* server) { server_.store(server); }
  void SetReady(bool ready) { ready_.store(ready); }
  // Set before the server starts. With a token, the metadata, config and statistics RPCs
  // need it, and inference too unless `inference` is false; the probes (ServerLive,
  // ServerReady, ModelReady, grpc.health.v1) stay open. Failures are UNAUTHENTICATED.
  void SetAuth(const TokenAuth* auth, bool inference) {
    auth_ = auth;
    auth_inference_ = inference;
  }
  // Set before the server starts; both limits at least 1.
  void SetStreamLimits(const StreamLimits& limits) { stream_limits_ = limits; }
  // Set before the server starts: the registry behind the SystemSharedMemory RPCs (the
  // same one the InferenceServer reads tensors from). Without it they are UNIMPLEMENTED.
  void SetSharedMemory(SharedMemoryRegistry* registry) { shared_memory_ = registry; }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext*, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse*) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext*, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse*) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext*, const inference::ModelReadyRequest*,
                                       inference::ModelReadyResponse*) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext*, const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse*) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext*, const inference::ModelMetadataRequest*,
                                          inference::ModelMetadataResponse*) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext*, const inference::ModelConfigRequest*,
                                        inference::ModelConfigResponse*) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext*, const inference::ModelStatisticsRequest*,
                                            inference::ModelStatisticsResponse*) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext*, const grpc::ByteBuffer*,
                                       grpc::ByteBuffer*) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(grpc::CallbackServerContext*) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext*,
                                                     const inference::SystemSharedMemoryStatusRequest*,
                                                     inference::SystemSharedMemoryStatusResponse*) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext*,
                                                       const inference::SystemSharedMemoryRegisterRequest*,
                                                       inference::SystemSharedMemoryRegisterResponse*) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext*,
                                                         const inference::SystemSharedMemoryUnregisterRequest*,
                                                         inference::SystemSharedMemoryUnregisterResponse*) override;
  // CUDA regions cannot be registered yet (no CUDA IPC mapping): Register is
  // UNIMPLEMENTED; Status lists none and Unregister has nothing to remove, so that
  // clients which clean up both kinds (perf_analyzer does) work.
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(grpc::CallbackServerContext*,
                                                   const inference::CudaSharedMemoryStatusRequest*,
                                                   inference::CudaSharedMemoryStatusResponse*) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(grpc::CallbackServerContext*,
                                                     const inference::CudaSharedMemoryRegisterRequest*,
                                                     inference::CudaSharedMemoryRegisterResponse*) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(grpc::CallbackServerContext*,
                                                       const inference::CudaSharedMemoryUnregisterRequest*,
                                                       inference::CudaSharedMemoryUnregisterResponse*) override;
  // Blocks until every RepositoryModelLoad/Unload still running has answered. Call it
  // after the gRPC server has shut down and before the InferenceServer goes away.
  void WaitForControlCalls();

  // Model control (Triton's model repository extension), through InferenceServer's
  // LoadModel, UnloadModel and RepositoryIndex. Loads and unloads may take seconds
  // (weights, warm-up, draining), so each runs on a thread of its own, not on one of
  // gRPC's callback threads.
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext*, const inference::RepositoryIndexRequest*,
                                            inference::RepositoryIndexResponse*) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext*,
                                                const inference::RepositoryModelLoadRequest*,
                                                inference::RepositoryModelLoadResponse*) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext*,
                                                  const inference::RepositoryModelUnloadRequest*,
                                                  inference::RepositoryModelUnloadResponse*) override;

 private:
  // The served model (held for the caller's use); null with the error in `error`:
  // NOT_FOUND for an unknown model or version, UNAVAILABLE for one not loaded.
  std::shared_ptr<const Model> FindModel(const std::string& name, const std::string& version,
                                         grpc::Status* error) const;
  grpc::Status Authenticate(const grpc::CallbackServerContext& ctx, bool inference) const;
  const std::string version_;
  std::atomic<InferenceServer*> server_{nullptr};
  std::atomic<bool> ready_{false};
  const TokenAuth* auth_ = nullptr;
  bool auth_inference_ = true;
  StreamLimits stream_limits_;
  SharedMemoryRegistry* shared_memory_ = nullptr;
  std::mutex control_mu_;
  std::condition_variable control_cv_;
  int control_calls_ = 0;  // RepositoryModelLoad/Unload threads still running
  // RepositoryModelLoad (load) and RepositoryModelUnload: their checks, then the call.
  grpc::ServerUnaryReactor* Control(grpc::CallbackServerContext* ctx, const char* rpc, const std::string& model,
                                    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& params,
                                    bool load);
};

grpc::Status ToGrpc(const absl::Status& s);
// The ServerMetadata and ModelMetadata answers, shared with the HTTP frontend.
void FillServerMetadata(const std::string& version, const SharedMemoryRegistry* shared_memory,
                        inference::ServerMetadataResponse* resp);
// `versions`: the model's served versions (InferenceServer::Versions).
void FillModelMetadata(const inference::ModelConfig& config, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* resp);

}  // namespace flashq::server
