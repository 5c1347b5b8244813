#include "client/lib/client.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "client/lib/tensor.h"

namespace flashq::client {
namespace {

void ApplyDeadline(grpc::ClientContext& ctx, const CallOptions& opts) {
  if (opts.timeout != absl::InfiniteDuration())
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(opts.timeout));
}

struct AsyncCall {
  grpc::ClientContext ctx;
  std::shared_ptr<const inference::ModelInferRequest> req;
  inference::ModelInferResponse resp;
  Client::InferCallback done;
};

}  // namespace

absl::Status ToAbsl(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus() : absl::Status(absl::StatusCode(int(s.error_code())), s.error_message());
}

namespace {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(const TlsOptions& tls) {
  const bool has_key = !tls.private_key_pem.empty(), has_chain = !tls.cert_chain_pem.empty();
  if (!tls.enabled) {
    if (has_key || has_chain || !tls.root_certs_pem.empty())
      return absl::InvalidArgumentError("TLS certificates or keys are given but TLS is off");
    return grpc::InsecureChannelCredentials();
  }
  if (has_key != has_chain)
    return absl::InvalidArgumentError("a client private key and certificate chain must be given together");
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls.root_certs_pem;
  ssl.pem_private_key = tls.private_key_pem;
  ssl.pem_cert_chain = tls.cert_chain_pem;
  return grpc::SslCredentials(ssl);
}

grpc_compression_algorithm GrpcAlgorithm(Compression c) {
  switch (c) {
    case Compression::kGzip: return GRPC_COMPRESS_GZIP;
    case Compression::kDeflate: return GRPC_COMPRESS_DEFLATE;
    case Compression::kNone: break;
  }
  return GRPC_COMPRESS_NONE;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no endpoints given");
  if (options.channels_per_endpoint < 1) return absl::InvalidArgumentError("channels_per_endpoint < 1");
  for (const auto& h : options.headers)
    if (absl::Status s = CheckHeader(h); !s.ok()) return s;
  auto credentials = MakeCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<Client> c(new Client());
  c->headers_ = options.headers;
  c->endpoints_ = options.endpoints;
  c->channels_per_endpoint_ = options.channels_per_endpoint;
  c->ring_ = HashRing(options.virtual_nodes);
  for (const auto& ep : options.endpoints) {
    if (ep.empty()) return absl::InvalidArgumentError("empty endpoint");
    c->ring_.Add(ep);
    for (int ch = 0; ch < options.channels_per_endpoint; ++ch) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      // Without a local pool, channels with equal arguments share one connection.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      // Responses are megabytes: open each stream with a large HTTP/2 window rather than
      // letting the first big response crawl through 64 KB windows while BDP probing grows it.
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
      if (options.compression != Compression::kNone) args.SetCompressionAlgorithm(GrpcAlgorithm(options.compression));
      auto channel = grpc::CreateCustomChannel(ep, *credentials, args);
      c->stubs_.push_back(inference::GRPCInferenceService::NewStub(channel));
    }
  }
  return c;
}

Client::~Client() {
  // Callbacks refer to nothing in Client, but their stubs must outlive them.
  while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Client::Prepare(grpc::ClientContext& ctx) const {
  for (const auto& [name, value] : headers_) ctx.AddMetadata(name, value);
}

inference::GRPCInferenceService::Stub& Client::stub(int endpoint) {
  const uint64_t turn = rr_.fetch_add(1, std::memory_order_relaxed);
  return *stubs_[endpoint * channels_per_endpoint_ + int(turn % channels_per_endpoint_)];
}

int Client::PickEndpoint(const inference::ModelInferRequest& req) { return Route(req, CallOptions{}); }

int Client::Route(const inference::ModelInferRequest& req, const CallOptions& opts) {
  if (opts.endpoint >= 0 && opts.endpoint < num_endpoints()) return opts.endpoint;
  if (num_endpoints() == 1) return 0;
  if (uint64_t id = SequenceId(req); id != 0) return ring_.Lookup(id);
  return int(rr_.fetch_add(1, std::memory_order_relaxed) % endpoints_.size());
}

grpc::Status Client::Infer(const inference::ModelInferRequest& req, inference::ModelInferResponse* resp,
                           const CallOptions& opts) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  ApplyDeadline(ctx, opts);
  return stub(Route(req, opts)).ModelInfer(&ctx, req, resp);
}

void Client::AsyncInfer(std::shared_ptr<const inference::ModelInferRequest> req, InferCallback done,
                        const CallOptions& opts) {
  auto* call = new AsyncCall;
  call->req = std::move(req);
  call->done = std::move(done);
  ApplyDeadline(call->ctx, opts);
  Prepare(call->ctx);
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  stub(Route(*call->req, opts))
      .async()
      ->ModelInfer(&call->ctx, call->req.get(), &call->resp, [this, call](grpc::Status s) {
        call->done(s, call->resp);
        delete call;
        in_flight_.fetch_sub(1, std::memory_order_relaxed);
      });
}

std::unique_ptr<InferStream> Client::OpenStream(int endpoint, const CallOptions& opts) {
  if (endpoint < 0 || endpoint >= num_endpoints())
    endpoint = int(rr_.fetch_add(1, std::memory_order_relaxed) % endpoints_.size());
  return std::make_unique<InferStream>(stub(endpoint), opts, headers_);
}

grpc::Status Client::ServerReady(int endpoint, bool* ready) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  inference::ServerReadyRequest req;
  inference::ServerReadyResponse resp;
  grpc::Status s = stub(endpoint).ServerReady(&ctx, req, &resp);
  *ready = s.ok() && resp.ready();
  return s;
}

grpc::Status Client::ModelReady(int endpoint, std::string_view model, bool* ready) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  inference::ModelReadyRequest req;
  req.set_name(std::string(model));
  inference::ModelReadyResponse resp;
  grpc::Status s = stub(endpoint).ModelReady(&ctx, req, &resp);
  *ready = s.ok() && resp.ready();
  return s;
}

grpc::Status Client::ModelMetadata(int endpoint, std::string_view model, inference::ModelMetadataResponse* resp) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  inference::ModelMetadataRequest req;
  req.set_name(std::string(model));
  return stub(endpoint).ModelMetadata(&ctx, req, resp);
}

grpc::Status Client::ModelStatistics(int endpoint, std::string_view model,
                                     inference::ModelStatisticsResponse* resp) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  inference::ModelStatisticsRequest req;
  req.set_name(std::string(model));
  return stub(endpoint).ModelStatistics(&ctx, req, resp);
}

namespace {

// Administrative calls get a short deadline, like the metadata calls above.
void AdminDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

}  // namespace

grpc::Status Client::SystemSharedMemoryRegister(int endpoint, std::string_view name, std::string_view key,
                                                uint64_t offset, uint64_t byte_size) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  AdminDeadline(ctx);
  inference::SystemSharedMemoryRegisterRequest req;
  req.set_name(std::string(name));
  req.set_key(std::string(key));
  req.set_offset(offset);
  req.set_byte_size(byte_size);
  inference::SystemSharedMemoryRegisterResponse resp;
  return stub(endpoint).SystemSharedMemoryRegister(&ctx, req, &resp);
}

grpc::Status Client::SystemSharedMemoryUnregister(int endpoint, std::string_view name) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  AdminDeadline(ctx);
  inference::SystemSharedMemoryUnregisterRequest req;
  req.set_name(std::string(name));
  inference::SystemSharedMemoryUnregisterResponse resp;
  return stub(endpoint).SystemSharedMemoryUnregister(&ctx, req, &resp);
}

grpc::Status Client::SystemSharedMemoryStatus(int endpoint, std::string_view name,
                                              inference::SystemSharedMemoryStatusResponse* resp) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  AdminDeadline(ctx);
  inference::SystemSharedMemoryStatusRequest req;
  req.set_name(std::string(name));
  return stub(endpoint).SystemSharedMemoryStatus(&ctx, req, resp);
}

grpc::Status Client::CudaSharedMemoryRegister(int endpoint, std::string_view name, std::string_view raw_handle,
                                              int64_t device_id, uint64_t byte_size) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  AdminDeadline(ctx);
  inference::CudaSharedMemoryRegisterRequest req;
  req.set_name(std::string(name));
  req.set_raw_handle(std::string(raw_handle));
  req.set_device_id(device_id);
  req.set_byte_size(byte_size);
  inference::CudaSharedMemoryRegisterResponse resp;
  return stub(endpoint).CudaSharedMemoryRegister(&ctx, req, &resp);
}

grpc::Status Client::CudaSharedMemoryUnregister(int endpoint, std::string_view name) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  AdminDeadline(ctx);
  inference::CudaSharedMemoryUnregisterRequest req;
  req.set_name(std::string(name));
  inference::CudaSharedMemoryUnregisterResponse resp;
  return stub(endpoint).CudaSharedMemoryUnregister(&ctx, req, &resp);
}

grpc::Status Client::CudaSharedMemoryStatus(int endpoint, std::string_view name,
                                            inference::CudaSharedMemoryStatusResponse* resp) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  AdminDeadline(ctx);
  inference::CudaSharedMemoryStatusRequest req;
  req.set_name(std::string(name));
  return stub(endpoint).CudaSharedMemoryStatus(&ctx, req, resp);
}

absl::Status Client::WaitUntilReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int e = 0; e < num_endpoints(); ++e) {
    for (;;) {
      bool ready = false;
      grpc::Status s = ServerReady(e, &ready);
      if (ready) break;
      if (absl::Now() > deadline)
        return absl::DeadlineExceededError(absl::StrFormat(
            "%s not ready after %s: %s", endpoints_[e], absl::FormatDuration(timeout),
            s.ok() ? "ServerReady returned false" : s.error_message()));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return absl::OkStatus();
}

InferStream::InferStream(inference::GRPCInferenceService::Stub& stub, const CallOptions& opts,
                         const std::vector<Header>& headers) {
  ApplyDeadline(ctx_, opts);
  for (const auto& [name, value] : headers) ctx_.AddMetadata(name, value);
  rw_ = stub.ModelStreamInfer(&ctx_);
}

bool InferStream::Send(const inference::ModelInferRequest& req) { return rw_->Write(req); }
bool InferStream::Recv(inference::ModelStreamInferResponse* resp) { return rw_->Read(resp); }
void InferStream::CloseSend() { rw_->WritesDone(); }
grpc::Status InferStream::Finish() { return rw_->Finish(); }

}  // namespace flashq::client
