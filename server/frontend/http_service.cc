#include "server/frontend/http_service.h"

#include <httplib.h>

#include <pthread.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/core/client_text.h"
#include "server/frontend/grpc_service.h"
#include "server/frontend/http_json.h"
#include "server/frontend/infer_codec.h"

namespace flashq::server {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";
constexpr char kNoSharedMemory[] = "shared memory (system and CUDA) is turned off here (--max-shared-memory-regions=0)";
constexpr char kModel[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

void Error(httplib::Response& res, const absl::Status& s) {
  res.status = HttpStatusOf(s.code());
  res.set_content(JsonError(std::string(s.message())), kJson);
}

void Json(httplib::Response& res, const std::string& body) {
  res.status = 200;
  res.set_content(body, kJson);
}

std::string Match(const httplib::Request& req, size_t i) {
  return i < req.matches.size() ? std::string(req.matches[i]) : std::string();
}

absl::StatusOr<json> ParseBody(const std::string& body) {
  if (body.empty()) return json::object();
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed JSON in the request body: ", e.what()));
  }
}

// The handler threads. cpp-httplib's own pool makes std::threads, whose stack size follows
// `ulimit -s`; this one sets it, so that every handler's stack holds cuBLASLt's static TLS
// block whatever the limit, and a thread that cannot start fails Start() with its errno.
class HandlerPool final : public httplib::TaskQueue {
 public:
  static constexpr size_t kStackBytes = size_t(8) << 20;  // reserved, touched only as used

  static absl::StatusOr<std::unique_ptr<HandlerPool>> Create(int threads) {
    std::unique_ptr<HandlerPool> pool(new HandlerPool);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, kStackBytes);
    int err = 0;
    for (int i = 0; i < threads && err == 0; ++i) {
      pthread_t t;
      err = pthread_create(&t, &attr, &HandlerPool::Run, pool.get());
      if (err == 0) pool->threads_.push_back(t);
    }
    pthread_attr_destroy(&attr);
    if (err != 0) {
      pool->shutdown();
      return absl::ResourceExhaustedError(absl::StrCat("cannot start HTTP threads (", kStackBytes >> 20,
                                                       " MiB stacks): ", std::strerror(err)));
    }
    return pool;
  }
  ~HandlerPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (pthread_t t : threads_) pthread_join(t, nullptr);
    threads_.clear();
  }

 private:
  HandlerPool() = default;
  static void* Run(void* self) {
    static_cast<HandlerPool*>(self)->Loop();
    return nullptr;
  }
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every accepted connection served
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<pthread_t> threads_;
};

}  // namespace

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:  // Triton's UNSUPPORTED is 400 too
      return 400;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

HttpInferenceService::HttpInferenceService(std::string version, const HttpOptions& options)
    : version_(std::move(version)), options_(options) {}

absl::StatusOr<std::unique_ptr<HttpInferenceService>> HttpInferenceService::Start(const std::string& host, int port,
                                                                                   std::string version,
                                                                                   const HttpOptions& options) {
  std::unique_ptr<HttpInferenceService> s(new HttpInferenceService(std::move(version), options));
  const TlsOptions& tls = options.tls;
  if (!tls.cert_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(tls.cert_file.c_str(), tls.key_file.c_str(),
                                                    tls.ca_file.empty() ? nullptr : tls.ca_file.c_str());
    if (!ssl->is_valid()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot set up TLS from --tls-cert '", tls.cert_file,
                                                        "' and --tls-key '", tls.key_file, "'"));
    }
    s->http_ = std::move(ssl);
  } else {
    s->http_ = std::make_unique<httplib::Server>();
  }
  // cpp-httplib asks for its task queue once, when it starts listening, and owns it from then on.
  auto pool = HandlerPool::Create(std::max(1, options.threads));
  if (!pool.ok()) return pool.status();
  s->http_->new_task_queue = [queue = pool->release()]() -> httplib::TaskQueue* { return queue; };
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, with which a second server
  // on the same port would start and silently take half of the connections.
  s->http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s->http_->set_payload_max_length(options.max_body_bytes);
  s->http_->set_keep_alive_max_count(1000);
  s->Route();
  const int bound = port == 0 ? s->http_->bind_to_any_port(host) : (s->http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  s->port_ = bound;
  httplib::Server* http = s->http_.get();
  s->thread_ = std::thread([http] { http->listen_after_bind(); });
  return s;
}

HttpInferenceService::~HttpInferenceService() { Stop(); }

void HttpInferenceService::Stop() {
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

bool HttpInferenceService::Authorized(const httplib::Request& req, httplib::Response& res, bool inference) const {
  if (!options_.auth || !options_.auth->enabled() || (inference && !options_.auth_inference)) return true;
  const bool has = req.has_header("Authorization");
  const std::string value = has ? req.get_header_value("Authorization") : std::string();
  grpc::Status s = options_.auth->CheckHeader(has ? &value : nullptr);
  if (s.ok()) return true;
  res.set_header("WWW-Authenticate", "Bearer");
  Error(res, absl::UnauthenticatedError(s.error_message()));
  return false;
}

std::shared_ptr<const Model> HttpInferenceService::FindModel(const std::string& name, const std::string& version,
                                                             httplib::Response& res) const {
  InferenceServer* s = server_.load();
  if (!s) {
    Error(res, absl::UnavailableError("server is loading models"));
    return nullptr;
  }
  absl::Status why;
  std::shared_ptr<const Model> m = s->FindModel(name, version, &why);
  if (!m) Error(res, why);
  return m;
}

void HttpInferenceService::Route() {
  httplib::Server& h = *http_;
  // POST handlers read their body themselves. HTTP/1.1 gives a request with neither
  // Content-Length nor Transfer-Encoding an empty body (tritonclient sends such POSTs);
  // cpp-httplib would instead read until the connection closes, and answer 400.
  using PostHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;
  auto post = [&h](const std::string& pattern, PostHandler handler) {
    h.Post(pattern, [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                    const httplib::ContentReader& read) {
      std::string body;
      if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
        const bool ok = read([&body](const char* data, size_t n) {
          body.append(data, n);
          return true;
        });
        if (!ok) {  // the status (413: over the limit, 400: cut short) is set; the error handler adds the body
          if (res.status < 400) res.status = 400;
          res.set_header("Connection", "close");  // the rest of the body is still unread
          return;
        }
      }
      handler(req, body, res);
    });
  };
  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own answer
    std::string why = res.status == 404   ? absl::StrCat("no endpoint ", req.method, " ", req.path)
                      : res.status == 413 ? "request body too large"
                                          : absl::StrCat("HTTP ", res.status);
    res.set_content(JsonError(why), kJson);
  });
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = absl::StrCat("internal error: ", e.what());
    } catch (...) {
    }
    Error(res, absl::InternalError(what));
  });

  // Probes stay open, as on gRPC; not ready answers 400, as in Triton.
  h.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  h.Get("/v2/health/ready", [this](const httplib::Request&, httplib::Response& res) {
    res.status = ready_.load() ? 200 : 400;
  });
  h.Get(absl::StrCat(kModel, "/ready"), [this](const httplib::Request& req, httplib::Response& res) {
    InferenceServer* s = server_.load();
    const bool ready = ready_.load() && s && s->FindModel(Match(req, 1), Match(req, 2)) != nullptr;
    res.status = ready ? 200 : 400;
  });

  h.Get("/v2", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    inference::ServerMetadataResponse md;
    FillServerMetadata(version_, options_.shared_memory, &md);
    md.add_extensions("binary_tensor_data");
    Json(res, ProtoToJson(md));
  });
  // Before the model paths, which would take "stats" for a model name (routes match in order).
  h.Get("/v2/models/stats", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    Statistics("", "", res);
  });
  h.Get(kModel, [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    std::shared_ptr<const Model> m = FindModel(Match(req, 1), Match(req, 2), res);
    if (!m) return;
    inference::ModelMetadataResponse md;
    FillModelMetadata(m->config(), server_.load()->Versions(m->config().name()), &md);
    Json(res, ProtoToJson(md));
  });
  h.Get(absl::StrCat(kModel, "/config"), [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    std::shared_ptr<const Model> m = FindModel(Match(req, 1), Match(req, 2), res);
    if (m) Json(res, ProtoToJson(m->config()));
  });
  h.Get(absl::StrCat(kModel, "/stats"), [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    Statistics(Match(req, 1), Match(req, 2), res);
  });
  post(absl::StrCat(kModel, "/infer"), [this](const httplib::Request& req, const std::string& body,
                                               httplib::Response& res) { Infer(req, body, res); });

  // Model control, as the gRPC repository RPCs: the index (with {"ready": true}, only the
  // served models), and load/unload, which block this handler thread until they finish.
  post("/v2/repository/index", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    InferenceServer* s = server_.load();
    if (!s) return Error(res, absl::UnavailableError("server is loading models"));
    bool ready_only = false;
    if (!body.empty()) {
      const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) return Error(res, absl::InvalidArgumentError("repository index: the body is not a JSON object"));
      ready_only = j.value("ready", false);
    }
    json index = json::array();
    for (const ModelIndexEntry& e : s->RepositoryIndex(ready_only)) {
      json entry = {{"name", e.name}, {"version", e.version}, {"state", e.state}};
      if (!e.reason.empty()) entry["reason"] = e.reason;
      index.push_back(entry);
    }
    Json(res, index.dump());
  });
  post(R"(/v2/repository/models/([^/]+)/(load|unload))",
       [this](const httplib::Request& req, const std::string&, httplib::Response& res) {
    if (!Authorized(req, res, false)) return;
    InferenceServer* s = server_.load();
    if (!s) return Error(res, absl::UnavailableError("server is loading models"));
    const absl::Status st = Match(req, 2) == "load" ? s->LoadModel(Match(req, 1)) : s->UnloadModel(Match(req, 1));
    if (!st.ok()) return Error(res, st);
    res.status = 200;
  });

  // Shared memory, as the gRPC RPCs of the same names.
  const std::string region = R"((?:/region/([^/]+))?)";
  for (const bool cuda : {false, true}) {
    const std::string base = cuda ? "/v2/cudasharedmemory" : "/v2/systemsharedmemory";
    h.Get(base + region + "/status", [this, cuda](const httplib::Request& req, httplib::Response& res) {
      if (!Authorized(req, res, false)) return;
      if (!options_.shared_memory) return Error(res, absl::UnimplementedError(kNoSharedMemory));
      auto regions = options_.shared_memory->Status(Match(req, 1), cuda);
      if (!regions.ok()) return Error(res, regions.status());
      json out = json::array();
      for (const SharedMemoryRegionStatus& r : *regions) {
        if (cuda) {
          out.push_back({{"name", r.name}, {"device_id", r.device}, {"byte_size", r.byte_size}});
        } else {
          out.push_back({{"name", r.name}, {"key", r.key}, {"offset", r.offset}, {"byte_size", r.byte_size}});
        }
      }
      Json(res, out.dump());
    });
    post(base + R"(/region/([^/]+)/register)", [this, cuda](const httplib::Request& req, const std::string& body_text,
                                                            httplib::Response& res) {
      if (!Authorized(req, res, false)) return;
      if (!options_.shared_memory) return Error(res, absl::UnimplementedError(kNoSharedMemory));
      auto body = ParseBody(body_text);
      if (!body.ok()) return Error(res, body.status());
      const json& b = *body;
      auto u64 = [&](const char* key) -> std::optional<uint64_t> {
        if (!b.is_object() || !b.contains(key)) return uint64_t(0);
        return b[key].is_number_unsigned() ? std::optional<uint64_t>(b[key].get<uint64_t>()) : std::nullopt;
      };
      const auto offset = u64("offset"), byte_size = u64("byte_size"), device = u64("device_id");
      if (!offset || !byte_size || !device) {
        return Error(res, absl::InvalidArgumentError("offset, byte_size and device_id must be integers >= 0"));
      }
      absl::Status s;
      if (cuda) {
        std::string handle;
        const bool has = b.is_object() && b.contains("raw_handle") && b["raw_handle"].is_object() &&
                         b["raw_handle"].contains("b64") && b["raw_handle"]["b64"].is_string();
        if (!has || !absl::Base64Unescape(b["raw_handle"]["b64"].get<std::string>(), &handle)) {
          return Error(res, absl::InvalidArgumentError("raw_handle must be {\"b64\": <base64 of the CUDA IPC handle>}"));
        }
        s = options_.shared_memory->RegisterCuda(Match(req, 1), handle, int64_t(*device), *byte_size);
      } else {
        if (!b.is_object() || !b.contains("key") || !b["key"].is_string()) {
          return Error(res, absl::InvalidArgumentError("the body must name the region's 'key'"));
        }
        s = options_.shared_memory->Register(Match(req, 1), b["key"].get<std::string>(), *offset, *byte_size);
      }
      if (!s.ok()) return Error(res, s);
      res.status = 200;
    });
    post(base + region + "/unregister", [this, cuda](const httplib::Request& req, const std::string&,
                                                     httplib::Response& res) {
      if (!Authorized(req, res, false)) return;
      if (!options_.shared_memory) return Error(res, absl::UnimplementedError(kNoSharedMemory));
      // A region in use stays mapped until its last request finishes (SharedMemoryRegistry).
      const std::string name = Match(req, 1);
      if (name.empty()) {
        options_.shared_memory->UnregisterAll(cuda);
      } else {
        options_.shared_memory->Unregister(name, cuda);
      }
      res.status = 200;
    });
  }
}

void HttpInferenceService::Statistics(const std::string& model, const std::string& version, httplib::Response& res) {
  InferenceServer* s = server_.load();
  if (!s) return Error(res, absl::UnavailableError("server is loading models"));
  if (!model.empty() && !FindModel(model, version, res)) return;
  inference::ModelStatisticsResponse stats;
  s->FillStatistics(model, &stats);
  Json(res, ProtoToJson(stats));
}

void HttpInferenceService::Infer(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  const std::string model = Match(req, 1);
  InferenceServer* s = server_.load();
  if (!Authorized(req, res, true)) {
    if (s) s->CountRejected(model, absl::StatusCode::kUnauthenticated);
    return;
  }
  if (!s || !ready_.load()) return Error(res, absl::UnavailableError("server is not ready"));
  std::optional<size_t> header_length;
  if (req.has_header("Inference-Header-Content-Length")) {
    size_t n = 0;
    if (!absl::SimpleAtoi(req.get_header_value("Inference-Header-Content-Length"), &n)) {
      s->CountRejected(model, absl::StatusCode::kInvalidArgument);
      return Error(res, absl::InvalidArgumentError("Inference-Header-Content-Length must be a byte count"));
    }
    header_length = n;
  }
  inference::ModelInferRequest request;
  HttpOutputForm form;
  if (absl::Status p = ParseHttpInferRequest(body, header_length, model, Match(req, 2), &request, &form); !p.ok()) {
    s->CountRejected(model, p.code());
    return Error(res, p);
  }
  // The handler's thread waits for the answer: cpp-httplib writes the response when the
  // handler returns.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  inference::ModelInferResponse response;
  s->Infer(request, {}, std::nullopt, [] { return false; }, [&](const absl::Status& st, Work* work) {
    if (st.ok()) FillInferResponse(request, *work, &response);
    std::lock_guard<std::mutex> l(mu);
    status = st;
    done = true;
    cv.notify_one();
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
  }
  if (!status.ok()) return Error(res, status);
  HttpInferResponse out = MakeHttpInferResponse(request, response, form);
  res.status = 200;
  if (out.header_length) {
    res.set_header("Inference-Header-Content-Length", std::to_string(*out.header_length));
    res.set_header("Content-Type", "application/octet-stream");
  } else {
    res.set_header("Content-Type", kJson);
  }
  res.body = std::move(out.body);  // tensors are megabytes: no copy
}

}  // namespace flashq::server
