#include "server/frontend/grpc_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/core/client_text.h"
#include "server/frontend/infer_codec.h"

namespace flashq::server {
namespace {

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  auto* r = ctx->DefaultReactor();
  r->Finish(status);
  return r;
}

std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  const auto now = std::chrono::system_clock::now();
  if (d >= now + std::chrono::hours(24 * 365)) return std::nullopt;  // no deadline set
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d - now);
}

constexpr char kNoSharedMemory[] = "shared memory (system and CUDA) is turned off here (--max-shared-memory-regions=0)";

const char* ConfigDType(inference::DataType t) {
  switch (t) {
    case inference::TYPE_FP16: return "FP16";
    case inference::TYPE_BF16: return "BF16";
    case inference::TYPE_FP32: return "FP32";
    case inference::TYPE_INT32: return "INT32";
    case inference::TYPE_INT64: return "INT64";
    case inference::TYPE_UINT8: return "UINT8";
    default: return "BYTES";
  }
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void FillServerMetadata(const std::string& version, const SharedMemoryRegistry* shared_memory,
                        inference::ServerMetadataResponse* resp) {
  resp->set_name("flashq");
  resp->set_version(version);
  for (const char* e : {"model_configuration", "model_repository", "statistics", "sequence", "ragged_batching"})
    resp->add_extensions(e);
  if (shared_memory) resp->add_extensions("system_shared_memory");
  if (shared_memory && shared_memory->cuda_capable()) resp->add_extensions("cuda_shared_memory");
}

void FillModelMetadata(const inference::ModelConfig& config, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* resp) {
  resp->set_name(config.name());
  for (int64_t v : versions) resp->add_versions(std::to_string(v));
  resp->set_platform(config.platform().empty() ? "flashq" : config.platform());
  for (const auto& in : config.input()) {
    auto* t = resp->add_inputs();
    t->set_name(in.name());
    t->set_datatype(ConfigDType(in.data_type()));
    for (int64_t d : in.dims()) t->add_shape(d);
  }
  for (const auto& out : config.output()) {
    auto* t = resp->add_outputs();
    t->set_name(out.name());
    t->set_datatype(ConfigDType(out.data_type()));
    for (int64_t d : out.dims()) t->add_shape(d);
  }
}

std::shared_ptr<const Model> GrpcInferenceService::FindModel(const std::string& name, const std::string& version,
                                                           grpc::Status* error) const {
  InferenceServer* s = server_.load();
  if (!s) {
    *error = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is loading models");
    return nullptr;
  }
  absl::Status why;
  std::shared_ptr<const Model> m = s->FindModel(name, version, &why);
  if (!m) *error = ToGrpc(why);
  return m;
}

grpc::Status GrpcInferenceService::Authenticate(const grpc::CallbackServerContext& ctx, bool inference) const {
  if (!auth_ || (inference && !auth_inference_)) return grpc::Status::OK;
  return auth_->Check(ctx);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ServerLive(grpc::CallbackServerContext* ctx,
                                                           const inference::ServerLiveRequest*,
                                                           inference::ServerLiveResponse* resp) {
  resp->set_live(true);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ServerReady(grpc::CallbackServerContext* ctx,
                                                            const inference::ServerReadyRequest*,
                                                            inference::ServerReadyResponse* resp) {
  resp->set_ready(ready_.load());
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelReady(grpc::CallbackServerContext* ctx,
                                                           const inference::ModelReadyRequest* req,
                                                           inference::ModelReadyResponse* resp) {
  grpc::Status err;
  resp->set_ready(ready_.load() && FindModel(req->name(), req->version(), &err) != nullptr);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ServerMetadata(grpc::CallbackServerContext* ctx,
                                                               const inference::ServerMetadataRequest*,
                                                               inference::ServerMetadataResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  FillServerMetadata(version_, shared_memory_, resp);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                              const inference::ModelMetadataRequest* req,
                                                              inference::ModelMetadataResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  grpc::Status err;
  std::shared_ptr<const Model> m = FindModel(req->name(), req->version(), &err);
  if (!m) return Reply(ctx, err);
  FillModelMetadata(m->config(), server_.load()->Versions(m->config().name()), resp);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelConfig(grpc::CallbackServerContext* ctx,
                                                            const inference::ModelConfigRequest* req,
                                                            inference::ModelConfigResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  grpc::Status err;
  std::shared_ptr<const Model> m = FindModel(req->name(), req->version(), &err);
  if (!m) return Reply(ctx, err);
  *resp->mutable_config() = m->config();
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelStatistics(grpc::CallbackServerContext* ctx,
                                                                const inference::ModelStatisticsRequest* req,
                                                                inference::ModelStatisticsResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  InferenceServer* s = server_.load();
  if (!s) return Reply(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is loading models"));
  if (!req->name().empty()) {
    grpc::Status err;
    if (!FindModel(req->name(), req->version(), &err)) return Reply(ctx, err);
  }
  s->FillStatistics(req->name(), resp);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelInfer(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  // Shared by the answer: the message and the receive slices its tensors point into.
  auto call = std::make_shared<RawInferRequest>();
  const absl::Status parsed = ParseRawInferRequest(*req, call.get());
  InferenceServer* s = server_.load();
  if (grpc::Status a = Authenticate(*ctx, true); !a.ok()) {
    if (s) s->CountRejected(call->message.model_name(), absl::StatusCode::kUnauthenticated);
    return Reply(ctx, a);
  }
  if (!parsed.ok()) {
    if (s) s->CountRejected("", parsed.code());
    return Reply(ctx, ToGrpc(parsed));
  }
  if (!s || !ready_.load()) return Reply(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready"));
  auto* reactor = ctx->DefaultReactor();
  s->Infer(call->message, std::move(call->raw), SteadyDeadline(ctx), [ctx] { return ctx->IsCancelled(); },
           [reactor, call, resp](const absl::Status& st, Work* work) {
             if (st.ok()) {
               grpc::ByteBuffer answer = SerializeInferResponse(call->message, *work);
               resp->Swap(&answer);
             }
             reactor->Finish(ToGrpc(st));
           });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcInferenceService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
    inference::SystemSharedMemoryStatusResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  auto regions = shared_memory_->Status(req->name());
  if (!regions.ok()) return Reply(ctx, ToGrpc(regions.status()));
  for (const SharedMemoryRegionStatus& r : *regions) {
    auto& out = (*resp->mutable_regions())[r.name];
    out.set_name(r.name);
    out.set_key(r.key);
    out.set_offset(r.offset);
    out.set_byte_size(r.byte_size);
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
    inference::SystemSharedMemoryRegisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  return Reply(ctx, ToGrpc(shared_memory_->Register(req->name(), req->key(), req->offset(), req->byte_size())));
}

grpc::ServerUnaryReactor* GrpcInferenceService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
    inference::SystemSharedMemoryUnregisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  // A region in use stays mapped until its last request finishes (SharedMemoryRegistry).
  if (req->name().empty()) {
    shared_memory_->UnregisterAll();
  } else {
    shared_memory_->Unregister(req->name());
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryStatusRequest* req,
    inference::CudaSharedMemoryStatusResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  auto regions = shared_memory_->Status(req->name(), /*cuda=*/true);
  if (!regions.ok()) return Reply(ctx, ToGrpc(regions.status()));
  for (const SharedMemoryRegionStatus& r : *regions) {
    auto& out = (*resp->mutable_regions())[r.name];
    out.set_name(r.name);
    out.set_device_id(uint64_t(r.device));
    out.set_byte_size(r.byte_size);
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryRegisterRequest* req,
    inference::CudaSharedMemoryRegisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  return Reply(ctx, ToGrpc(shared_memory_->RegisterCuda(req->name(), req->raw_handle(), req->device_id(),
                                                        req->byte_size())));
}

grpc::ServerUnaryReactor* GrpcInferenceService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryUnregisterRequest* req,
    inference::CudaSharedMemoryUnregisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  // A region in use stays open until its last request finishes (SharedMemoryRegistry).
  if (req->name().empty()) {
    shared_memory_->UnregisterAll(/*cuda=*/true);
  } else {
    shared_memory_->Unregister(req->name(), /*cuda=*/true);
  }
  return Reply(ctx, grpc::Status::OK);
}

namespace {

// Model control takes no parameters: Triton's "config" and "file:" overrides (a model
// sent inline) and "unload_dependents" (ensembles) have nothing to act on here.
grpc::Status CheckNoParameters(const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& params,
                               const char* rpc) {
  for (const auto& [key, value] : params) {
    if (key == "unload_dependents") continue;  // no model here has dependents
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat(rpc, ": parameter ", Quoted(key),
                                     " is not supported; models load from the server's repository as they are"));
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::ServerUnaryReactor* GrpcInferenceService::RepositoryIndex(grpc::CallbackServerContext* ctx,
                                                                const inference::RepositoryIndexRequest* req,
                                                                inference::RepositoryIndexResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  InferenceServer* s = server_.load();
  if (!s) return Reply(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is loading models"));
  for (const ModelIndexEntry& e : s->RepositoryIndex(req->ready())) {
    auto* m = resp->add_models();
    m->set_name(e.name);
    m->set_version(e.version);
    m->set_state(e.state);
    m->set_reason(e.reason);
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::Control(
    grpc::CallbackServerContext* ctx, const char* rpc, const std::string& model,
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& params, bool load) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  InferenceServer* s = server_.load();
  if (!s) return Reply(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is loading models"));
  if (grpc::Status p = CheckNoParameters(params, rpc); !p.ok()) return Reply(ctx, p);
  if (model.empty())
    return Reply(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat(rpc, ": model_name is empty")));
  // A load reads and warms up weights, an unload waits for the model's queued requests:
  // seconds, on a thread of its own rather than a gRPC one.
  auto* reactor = ctx->DefaultReactor();
  {
    std::lock_guard<std::mutex> l(control_mu_);
    ++control_calls_;
  }
  std::thread([this, reactor, s, model, load] {
    reactor->Finish(ToGrpc(load ? s->LoadModel(model) : s->UnloadModel(model)));
    std::lock_guard<std::mutex> l(control_mu_);
    if (--control_calls_ == 0) control_cv_.notify_all();
  }).detach();
  return reactor;
}

void GrpcInferenceService::WaitForControlCalls() {
  std::unique_lock<std::mutex> l(control_mu_);
  control_cv_.wait(l, [this] { return control_calls_ == 0; });
}

grpc::ServerUnaryReactor* GrpcInferenceService::RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                                    const inference::RepositoryModelLoadRequest* req,
                                                                    inference::RepositoryModelLoadResponse*) {
  return Control(ctx, "RepositoryModelLoad", req->model_name(), req->parameters(), /*load=*/true);
}

grpc::ServerUnaryReactor* GrpcInferenceService::RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                                      const inference::RepositoryModelUnloadRequest* req,
                                                                      inference::RepositoryModelUnloadResponse*) {
  return Control(ctx, "RepositoryModelUnload", req->model_name(), req->parameters(), /*load=*/false);
}

namespace {

// ModelStreamInfer: each request read is submitted at once, in the order read; responses
// are written in completion order (one write in flight at a time). Reading pauses while the
// stream is at its StreamLimits: a client that stops reading then stalls in HTTP/2 flow
// control instead of growing the server's memory. The byte limit counts the answers waiting
// to be written plus those still computing, each of those at the largest answer the stream
// has produced, since an admitted request's answer lands whether or not the client reads.
// Answers that can no longer be delivered (write failed, call cancelled) are dropped. The
// stream finishes when the client has half-closed and every submitted request has been
// answered or dropped.
class StreamReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(grpc::CallbackServerContext* ctx, InferenceServer* server, const StreamLimits& limits)
      : ctx_(ctx), server_(server), limits_(limits) {
    std::lock_guard<std::mutex> l(mu_);
    MaybeReadLocked();
  }

  void OnReadDone(bool ok) override {
    std::unique_ptr<grpc::ByteBuffer> read;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!ok) {
        reader_busy_ = false;
        reads_done_ = true;
        MaybeFinishLocked();
        return;
      }
      read = std::move(reading_);
      if (dead_) {  // nobody can receive its answer
        reader_busy_ = false;
        MaybeReadLocked();
        return;
      }
      ++pending_;
    }
    // Outside the lock: Infer may answer at once (a rejected request), which re-enters
    // Enqueue. The reader stays busy until the request is submitted, so submissions keep
    // the stream's order (kv_attention sequences depend on it). A request that does not
    // parse gets its error on the stream, which goes on.
    auto call = std::make_shared<RawInferRequest>();
    const absl::Status parsed = ParseRawInferRequest(*read, call.get());
    if (!parsed.ok()) {
      server_->CountRejected("", parsed.code());
      Enqueue(std::make_unique<grpc::ByteBuffer>(SerializeStreamResponse(parsed, call->message, nullptr)));
    } else {
      server_->Infer(call->message, std::move(call->raw), SteadyDeadline(ctx_), [this] { return ctx_->IsCancelled(); },
                     [this, call](const absl::Status& st, Work* work) {
                       Enqueue(std::make_unique<grpc::ByteBuffer>(SerializeStreamResponse(st, call->message, work)));
                     });
    }
    std::lock_guard<std::mutex> l(mu_);
    reader_busy_ = false;
    MaybeReadLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    queued_bytes_ -= writes_.front().bytes;
    writes_.pop_front();
    --pending_;
    if (!ok) dead_ = true;
    if (dead_) {
      pending_ -= int64_t(writes_.size());
      writes_.clear();
      queued_bytes_ = 0;
    } else if (!writes_.empty()) {
      StartWrite(writes_.front().response.get());
    }
    MaybeReadLocked();
    MaybeFinishLocked();
  }

  // A cancelled call delivers nothing more; resume reading (if paused) so that the
  // failed read ends the stream once the answers in flight are dropped.
  void OnCancel() override {
    std::lock_guard<std::mutex> l(mu_);
    dead_ = true;
    MaybeReadLocked();
  }

  // Finish may be called from a worker thread (in Enqueue) under mu_: wait for it to let go.
  void OnDone() override {
    { std::lock_guard<std::mutex> l(mu_); }
    delete this;
  }

 private:
  struct Answer {
    std::unique_ptr<grpc::ByteBuffer> response;
    int64_t bytes;
  };

  // Starts the next read unless one is outstanding, the client has half-closed, or the
  // stream is at its limits. With nothing pending it always reads, so an answer larger than
  // max_bytes cannot stall the stream. A dead stream reads on regardless: its reads fail at once.
  void MaybeReadLocked() {
    if (reader_busy_ || reads_done_ || finished_) return;
    if (!dead_ && pending_ > 0) {
      // Before the first answer, its size is unknown: admit at most 8 such requests' worth.
      const int64_t each = largest_answer_ > 0 ? largest_answer_ : std::max<int64_t>(1, limits_.max_bytes / 8);
      const int64_t computing = pending_ - int64_t(writes_.size());
      const int64_t room = limits_.max_bytes - queued_bytes_;  // computing * each must stay below it
      if (pending_ >= limits_.max_answers || room <= 0 || computing >= (room + each - 1) / each) return;
    }
    reader_busy_ = true;
    reading_ = std::make_unique<grpc::ByteBuffer>();
    StartRead(reading_.get());
  }

  void Enqueue(std::unique_ptr<grpc::ByteBuffer> r) {
    std::lock_guard<std::mutex> l(mu_);
    if (dead_) {
      --pending_;
      MaybeReadLocked();
      MaybeFinishLocked();
      return;
    }
    const int64_t bytes = int64_t(r->Length());
    largest_answer_ = std::max(largest_answer_, bytes);
    queued_bytes_ += bytes;
    writes_.push_back({std::move(r), bytes});
    if (writes_.size() == 1) StartWrite(writes_.front().response.get());
    MaybeReadLocked();  // the answer's real size may be below the estimate it was admitted at
  }

  void MaybeFinishLocked() {
    if (finished_ || pending_ > 0 || !reads_done_) return;
    finished_ = true;
    Finish(ctx_->IsCancelled() ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  grpc::CallbackServerContext* ctx_;
  InferenceServer* server_;
  const StreamLimits limits_;
  std::mutex mu_;
  std::unique_ptr<grpc::ByteBuffer> reading_;
  std::deque<Answer> writes_;  // the front one is being written
  int64_t pending_ = 0;        // requests read and submitted, not yet written or dropped
  int64_t queued_bytes_ = 0;   // serialized size of `writes_`
  int64_t largest_answer_ = 0;
  bool reader_busy_ = false;   // a read is outstanding, or its request is being submitted
  bool reads_done_ = false, dead_ = false, finished_ = false;
};

class RejectStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RejectStream(const grpc::Status& why) { Finish(why); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GrpcInferenceService::ModelStreamInfer(
    grpc::CallbackServerContext* ctx) {
  if (grpc::Status a = Authenticate(*ctx, true); !a.ok()) {
    // The stream is refused before any request is read, so no model name is known.
    if (InferenceServer* s = server_.load()) s->CountRejected("", absl::StatusCode::kUnauthenticated);
    return new RejectStream(a);
  }
  InferenceServer* s = server_.load();
  if (!s || !ready_.load()) return new RejectStream(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready"));
  return new StreamReactor(ctx, s, stream_limits_);
}

}  // namespace flashq::server
