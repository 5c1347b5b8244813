// Real Triton configs (tests/server/triton_configs/*.pbtxt), each with its expected
// outcome in its opening comments: loads, parses, or is refused with a given error; the
// fields logged as ignored; the workers its instance_group asks for.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/inference_server.h"
#include "server/repository/config_policy.h"
#include "server/repository/model_repository.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

struct Expectation {
  std::string outcome;  // loads, parses, refused
  std::vector<std::string> errors;
  std::set<std::string> warns;
  int workers = -1;
};

Expectation ReadExpectation(const fs::path& file) {
  Expectation e;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line) && absl::StartsWith(line, "#");) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "# expect: ")) e.outcome = std::string(v);
    else if (absl::ConsumePrefix(&v, "# error: ")) e.errors.emplace_back(v);
    else if (absl::ConsumePrefix(&v, "# warns: ")) e.warns.emplace(v);
    else if (absl::ConsumePrefix(&v, "# workers: ")) e.workers = std::stoi(std::string(v));
  }
  return e;
}

std::vector<std::string> ConfigNames() {
  std::vector<std::string> names;
  for (const auto& f : fs::directory_iterator(FQ_TRITON_CONFIGS))
    if (f.path().extension() == ".pbtxt") names.push_back(f.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The field a warning line names: "<file>:<line>: <field> is ignored: <why>".
std::string WarnedField(const std::string& w) {
  const size_t end = w.find(" is ignored: ");
  const size_t start = w.rfind(": ", end);
  return end == std::string::npos || start == std::string::npos ? w : w.substr(start + 2, end - start - 2);
}

class TritonConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(TritonConfig, HasItsExpectedOutcome) {
  const fs::path file = fs::path(FQ_TRITON_CONFIGS) / (GetParam() + ".pbtxt");
  const Expectation want = ReadExpectation(file);
  ASSERT_TRUE(want.outcome == "loads" || want.outcome == "parses" || want.outcome == "refused")
      << file << " has no valid '# expect:' line";

  std::vector<std::string> warnings;
  absl::Status status;
  auto config = ParseModelConfigFile(file.string(), GetParam(), &warnings);
  status = config.status();
  if (config.ok()) {
    std::set<std::string> warned;
    for (const std::string& w : warnings) warned.insert(WarnedField(w));
    EXPECT_EQ(absl::StrJoin(warned, ", "), absl::StrJoin(want.warns, ", ")) << absl::StrJoin(warnings, "\n");
    for (const std::string& w : warnings) EXPECT_TRUE(absl::StartsWith(w, file.string() + ":")) << w;

    InferenceServerOptions options;
    options.workers_per_model = 2;  // the CPU backend's default
    auto sched = SchedulerOptionsFor(*config, options, /*devices=*/1);
    if (!sched.ok()) status = sched.status();
    else if (want.workers >= 0) EXPECT_EQ(sched->workers, want.workers);
  }
  if (status.ok() && want.outcome != "parses") {
    BackendOptions bo;
    bo.cpu_threads = 1;
    CpuBackend backend(bo);
    auto registry = std::make_shared<prometheus::Registry>();
    ServerMetrics metrics(registry);
    auto server = InferenceServer::Create({{file.parent_path().string(), *config, warnings}}, backend, metrics, {});
    status = server.status();
  }
  if (want.outcome == "refused") {
    EXPECT_FALSE(status.ok()) << file << " was expected to be refused";
  } else {
    EXPECT_TRUE(status.ok()) << status;
  }
  for (const std::string& e : want.errors)
    EXPECT_TRUE(absl::StrContains(status.message(), e)) << "error: " << status << "\nexpected to contain: " << e;
}

INSTANTIATE_TEST_SUITE_P(Configs, TritonConfig, ::testing::ValuesIn(ConfigNames()),
                         [](const auto& info) { return info.param; });

// Every rule names a field of Triton's ModelConfig, so that the table cannot drift from
// the schema unnoticed.
TEST(FieldPolicy, EveryRuleNamesAFieldOfModelConfig) {
  for (const FieldRule& r : ModelConfigFieldRules()) {
    const google::protobuf::Descriptor* d = inference::ModelConfig::descriptor();
    std::stringstream parts(r.path);
    for (std::string part; std::getline(parts, part, '.');) {
      ASSERT_NE(d, nullptr) << r.path << ": " << part << " is inside a scalar";
      const auto* f = d->FindFieldByName(part);
      ASSERT_NE(f, nullptr) << r.path << ": no field " << part;
      d = f->message_type();
    }
  }
}

// Every top-level field of ModelConfig has a rule of its own.
TEST(FieldPolicy, EveryTopLevelFieldHasARule) {
  std::set<std::string> ruled;
  for (const FieldRule& r : ModelConfigFieldRules()) ruled.insert(r.path);
  const google::protobuf::Descriptor* d = inference::ModelConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) EXPECT_TRUE(ruled.count(d->field(i)->name())) << d->field(i)->name();
}

}  // namespace
}  // namespace flashq::server
