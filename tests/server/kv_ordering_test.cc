// kv_attention under many concurrent requests per sequence, through InferenceServer
// (decode, admission, the scheduler, the CPU backend): every answer must have read
// exactly the cache positions its own sequence wrote before it.
//
// Each sequence starts with one token and then gets kSteps decode steps sent at once
// from many threads, so their order is decided by the server. Q is zero, so attention
// is a uniform average over the cached positions, and every request's V is one-hot
// on its own channel. The answer of the request that got position p is therefore
// 1/(p+1) on exactly the p+1 channels of the requests at positions 0..p: a position
// read before it was written (zero, or another sequence's value left in a reused
// block) shows as a missing or foreign channel. Sequences end with a request of zero
// tokens, and run in rounds, so that later rounds reuse earlier rounds' blocks.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "common/dtype.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/inference_server.h"

namespace flashq::server {
namespace {

constexpr int kD = 64;            // channels: the start token's and one per decode step
constexpr int kSteps = kD - 1;
constexpr int kPage = 4;
constexpr int kSequences = 24;    // per round
constexpr int kRounds = 20;
constexpr int kThreads = 48;

inference::ModelConfig Config() {
  inference::ModelConfig c;
  const std::string text =
      "name: \"kv\" max_batch_size: 0\n"
      "input [ { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, 1, 64 ] },\n"
      "        { name: \"K\" data_type: TYPE_FP16 dims: [ -1, 1, 64 ] },\n"
      "        { name: \"V\" data_type: TYPE_FP16 dims: [ -1, 1, 64 ] } ]\n"
      "output [ { name: \"O\" data_type: TYPE_FP16 dims: [ -1, 1, 64 ] } ]\n"
      "parameters { key: \"kind\" value: { string_value: \"kv_attention\" } }\n"
      "parameters { key: \"num_heads_q\" value: { string_value: \"1\" } }\n"
      "parameters { key: \"num_heads_kv\" value: { string_value: \"1\" } }\n"
      "parameters { key: \"head_dim\" value: { string_value: \"64\" } }\n"
      "parameters { key: \"page_size\" value: { string_value: \"4\" } }\n"
      "parameters { key: \"max_queue_size\" value: { string_value: \"100000\" } }\n"
      "parameters { key: \"max_queue_delay_us\" value: { string_value: \"0\" } }\n"
      // One round's sequences fill the cache exactly: every round reuses every block.
      "parameters { key: \"num_blocks\" value: { string_value: \"" +
      std::to_string(kSequences * kD / kPage) + "\" } }\n";
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c));
  return c;
}

std::string OneHot(int channel) {
  std::vector<float> v(kD, 0.0f);
  if (channel >= 0) v[channel] = 1.0f;
  std::string bytes;
  AppendFromFloat(DType::kF16, v.data(), kD, &bytes);
  return bytes;
}

inference::ModelInferRequest Request(uint64_t id, int channel, bool start, bool end) {
  inference::ModelInferRequest r;
  r.set_model_name("kv");
  const int n = channel < 0 ? 0 : 1;
  const std::string zeros(size_t(n) * kD * 2, '\0');
  for (const char* name : {"Q", "K", "V"}) {
    auto* in = r.add_inputs();
    in->set_name(name);
    in->set_datatype("FP16");
    for (int64_t d : {int64_t(n), int64_t(1), int64_t(kD)}) in->add_shape(d);
    r.add_raw_input_contents(std::string(name) == "V" && n ? OneHot(channel) : zeros);
  }
  (*r.mutable_parameters())["sequence_id"].set_uint64_param(id);
  if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
  if (end) (*r.mutable_parameters())["sequence_end"].set_bool_param(true);
  return r;
}

// Runs one request to completion; returns its status and O as floats.
absl::Status Infer(InferenceServer& server, const inference::ModelInferRequest& r, std::vector<float>* o) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  server.Infer(r, {}, std::nullopt, nullptr, [&](const absl::Status& st, Work* w) {
    std::lock_guard<std::mutex> l(mu);
    status = st;
    if (st.ok()) {
      o->clear();
      if (w->outputs.size() == 1) AppendAsFloat(DType::kF16, w->outputs[0].data, o);
    }
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
  return status;
}

TEST(KvOrdering, ConcurrentStepsOfOneSequenceReadOnlyWhatWasWrittenBeforeThem) {
  BackendOptions bo;
  bo.cpu_threads = 1;
  CpuBackend backend(bo);
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  InferenceServerOptions so;
  so.workers_per_model = 4;
  auto server = InferenceServer::Create({{"/nonexistent", Config()}}, backend, metrics, so);
  ASSERT_TRUE(server.ok()) << server.status();

  std::mt19937 rng(7);
  int bad_answers = 0;
  std::string first_bad;
  for (int round = 0; round < kRounds; ++round) {
    struct Task {
      int seq, channel;
    };
    std::vector<Task> tasks;
    for (int s = 0; s < kSequences; ++s) {
      const uint64_t id = uint64_t(round) * 1000 + s + 1;
      std::vector<float> o;
      ASSERT_TRUE(Infer(**server, Request(id, 0, /*start=*/true, false), &o).ok());
      for (int c = 1; c <= kSteps; ++c) tasks.push_back({s, c});
    }
    std::shuffle(tasks.begin(), tasks.end(), rng);
    std::vector<std::vector<float>> answers(tasks.size());
    std::vector<absl::Status> statuses(tasks.size());
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < tasks.size();) {
          const uint64_t id = uint64_t(round) * 1000 + tasks[i].seq + 1;
          statuses[i] = Infer(**server, Request(id, tasks[i].channel, false, false), &answers[i]);
        }
      });
    }
    for (auto& t : threads) t.join();

    // Per sequence: the answers' channel sets must be a chain {0, c} ⊂ ... ⊂ all channels,
    // each answer holding 1/(p+1) on exactly its p+1 channels, its own among them.
    for (int s = 0; s < kSequences; ++s) {
      std::vector<std::set<int>> sets;
      for (size_t i = 0; i < tasks.size(); ++i) {
        if (tasks[i].seq != s) continue;
        ASSERT_TRUE(statuses[i].ok()) << statuses[i];
        ASSERT_EQ(answers[i].size(), size_t(kD));
        std::set<int> on;
        for (int c = 0; c < kD; ++c) {
          if (answers[i][c] != 0.0f) on.insert(c);
        }
        const double want = 1.0 / double(on.size());
        bool ok = on.count(0) && on.count(tasks[i].channel) && on.size() >= 2;
        for (int c : on) ok = ok && std::fabs(answers[i][c] - want) <= 2e-3 * want + 1e-6;
        if (!ok && bad_answers++ == 0) {
          first_bad = "round " + std::to_string(round) + " sequence " + std::to_string(s) + " step of channel " +
                      std::to_string(tasks[i].channel) + ": " + std::to_string(on.size()) + " channels on";
        }
        sets.push_back(std::move(on));
      }
      std::sort(sets.begin(), sets.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
      for (size_t j = 0; j < sets.size(); ++j) {
        const bool nested = sets[j].size() == j + 2 &&
                            (j == 0 || std::includes(sets[j].begin(), sets[j].end(), sets[j - 1].begin(), sets[j - 1].end()));
        if (!nested && bad_answers++ == 0) {
          first_bad = "round " + std::to_string(round) + " sequence " + std::to_string(s) +
                      ": the answers' positions do not form one order";
        }
      }
      // The end: zero new tokens, so that a full cache cannot stop it; it frees the blocks.
      std::vector<float> o;
      const uint64_t id = uint64_t(round) * 1000 + s + 1;
      absl::Status end = Infer(**server, Request(id, -1, false, /*end=*/true), &o);
      ASSERT_TRUE(end.ok()) << end;
      EXPECT_TRUE(o.empty());
    }
  }
  EXPECT_EQ(bad_answers, 0) << "first: " << first_bad;
}

}  // namespace
}  // namespace flashq::server
