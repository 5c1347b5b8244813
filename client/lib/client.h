// flashq's C++ client: a thin layer over the KServe v2 stubs with sync, async
// (gRPC callback API) and streaming calls to one or several endpoints.
//
// Routing: a request that carries a `sequence_id` parameter always goes to the
// endpoint that owns that id on a consistent-hash ring (its KV cache lives there);
// every other request goes round-robin. A caller can also pin a call to an endpoint.
//
// Security (connection.h): TLS or mutual TLS for every channel, and headers (such as
// `authorization: Bearer <token>`) that every call carries, probes included, so that
// one client works whichever RPCs the server guards.
//
//   auto client = flashq::client::Client::Create({.endpoints = {"a:8001", "b:8001"}});
//   inference::ModelInferRequest req;  req.set_model_name("attention");
//   AddFloatInput(req, "Q", DType::kF16, shape, q); ...
//   inference::ModelInferResponse resp;
//   grpc::Status s = (*client)->Infer(req, &resp);
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/lib/connection.h"
#include "client/lib/hash_ring.h"
#include "grpc_service.grpc.pb.h"

namespace flashq::client {

struct ClientOptions {
  std::vector<std::string> endpoints;  // "host:port"
  int virtual_nodes = 160;             // points per endpoint on the hash ring
  // More than one channel per endpoint opens several HTTP/2 connections, which
  // spreads load over the server's completion queues at high concurrency.
  int channels_per_endpoint = 1;
  TlsOptions tls;                // off: plaintext
  std::vector<Header> headers;   // metadata sent with every call
  Compression compression = Compression::kNone;  // of requests; the server answers uncompressed
};

struct CallOptions {
  absl::Duration timeout = absl::InfiniteDuration();
  int endpoint = -1;  // -1: route by sequence_id, else round-robin
};

class InferStream;

class Client {
 public:
  using InferCallback = std::function<void(const grpc::Status&, inference::ModelInferResponse&)>;

  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();

  int num_endpoints() const { return int(endpoints_.size()); }
  const std::string& endpoint(int i) const { return endpoints_[i]; }

  // The endpoint a request would be sent to (consumes a round-robin turn when stateless).
  int PickEndpoint(const inference::ModelInferRequest& req);
  int EndpointForSequence(uint64_t sequence_id) const { return ring_.Lookup(sequence_id); }

  // Synchronous ModelInfer.
  grpc::Status Infer(const inference::ModelInferRequest& req, inference::ModelInferResponse* resp,
                     const CallOptions& opts = {});
  // Asynchronous ModelInfer: `done` runs on a gRPC thread when the call ends. It must
  // not block; it may start further calls. The request is shared, not copied.
  void AsyncInfer(std::shared_ptr<const inference::ModelInferRequest> req, InferCallback done,
                  const CallOptions& opts = {});
  // A bidirectional ModelStreamInfer stream to one endpoint (-1: round-robin).
  std::unique_ptr<InferStream> OpenStream(int endpoint = -1, const CallOptions& opts = {});

  grpc::Status ServerReady(int endpoint, bool* ready);
  grpc::Status ModelReady(int endpoint, std::string_view model, bool* ready);
  grpc::Status ModelMetadata(int endpoint, std::string_view model, inference::ModelMetadataResponse* resp);
  grpc::Status ModelStatistics(int endpoint, std::string_view model, inference::ModelStatisticsResponse* resp);

  // Triton's shared-memory extensions. A registered region is named by a tensor's
  // shared_memory_region parameter (SetSharedMemory in tensor.h). An empty `name`
  // unregisters, or reports, every region of that kind.
  grpc::Status SystemSharedMemoryRegister(int endpoint, std::string_view name, std::string_view key, uint64_t offset,
                                          uint64_t byte_size);
  grpc::Status SystemSharedMemoryUnregister(int endpoint, std::string_view name);
  grpc::Status SystemSharedMemoryStatus(int endpoint, std::string_view name,
                                        inference::SystemSharedMemoryStatusResponse* resp);
  // `raw_handle` holds the bytes of a cudaIpcMemHandle_t of memory on GPU `device_id`.
  grpc::Status CudaSharedMemoryRegister(int endpoint, std::string_view name, std::string_view raw_handle,
                                        int64_t device_id, uint64_t byte_size);
  grpc::Status CudaSharedMemoryUnregister(int endpoint, std::string_view name);
  grpc::Status CudaSharedMemoryStatus(int endpoint, std::string_view name,
                                      inference::CudaSharedMemoryStatusResponse* resp);
  // Polls ServerReady on every endpoint until all are ready or `timeout` passes.
  absl::Status WaitUntilReady(absl::Duration timeout);

  inference::GRPCInferenceService::Stub& stub(int endpoint);
  int64_t calls_in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  Client() = default;
  // Every call's context gets the headers.
  void Prepare(grpc::ClientContext& ctx) const;
  int Route(const inference::ModelInferRequest& req, const CallOptions& opts);

  std::vector<std::string> endpoints_;
  int channels_per_endpoint_ = 1;
  std::vector<Header> headers_;
  // stubs_[endpoint * channels_per_endpoint_ + c]
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs_;
  HashRing ring_;
  std::atomic<uint64_t> rr_{0};
  std::atomic<int64_t> in_flight_{0};
};

// A ModelStreamInfer stream: Send() requests, Recv() responses (in order for
// flashq's server). Used by one thread for sending and one for receiving at most.
class InferStream {
 public:
  InferStream(inference::GRPCInferenceService::Stub& stub, const CallOptions& opts,
              const std::vector<Header>& headers = {});
  bool Send(const inference::ModelInferRequest& req);
  // False at the end of the stream. A per-request error arrives as a response with
  // error_message set.
  bool Recv(inference::ModelStreamInferResponse* resp);
  void CloseSend();
  grpc::Status Finish();  // call after CloseSend() and after Recv() returned false

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<inference::ModelInferRequest, inference::ModelStreamInferResponse>> rw_;
};

absl::Status ToAbsl(const grpc::Status& s);

}  // namespace flashq::client
