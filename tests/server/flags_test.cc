// FlagSet (common/flags.h) as flashq-server uses it: Triton-style --dash-flags (--a=1, --a 1),
// underscores accepted, bool forms, errors for unknown flags and bad values, --help.
#include "common/flags.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::server {
namespace {

struct Flags {
  std::string repo = "/models";
  int64_t port = 8001;
  int64_t delay = 500;
  bool strict = false;
  bool invariant = true;
};

class FlagsTest : public ::testing::Test {
 protected:
  FlagsTest() : set_("usage: flashq-server [flags]") {
    set_.Add("model-repository", &f_.repo, "Model repository directory");
    set_.Add("grpc-port", &f_.port, "gRPC port");
    set_.Add("max-queue-delay-us", &f_.delay, "Batcher delay");
    set_.Add("strict-model-config", &f_.strict, "Strict configs");
    set_.Add("batch-invariant", &f_.invariant, "Batch-invariant kernels");
  }

  // Parses argv[1..]; returns whether it succeeded.
  bool Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "flashq-server");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    error_.clear();
    return set_.Parse(int(args.size()), argv.data(), &help_, &error_);
  }

  Flags f_;
  FlagSet set_;
  bool help_ = false;
  std::string error_;
};

TEST_F(FlagsTest, DefaultsWithNoArguments) {
  ASSERT_TRUE(Parse({})) << error_;
  EXPECT_FALSE(help_);
  EXPECT_EQ(f_.port, 8001);
  EXPECT_EQ(f_.repo, "/models");
}

TEST_F(FlagsTest, RepeatableFlagCollectsEveryValue) {
  std::vector<std::string> models;
  set_.Add("load-model", &models, "Model to load");
  ASSERT_TRUE(Parse({"--load-model=a", "--load-model", "b", "--load-model="})) << error_;
  EXPECT_EQ(models, (std::vector<std::string>{"a", "b"})) << "an empty value (the default) adds nothing";
  EXPECT_TRUE(set_.WasSet("load-model"));
  EXPECT_NE(set_.Help().find("--load-model (default \"\")"), std::string::npos) << set_.Help();
}

TEST_F(FlagsTest, EqualsAndSpaceForms) {
  ASSERT_TRUE(Parse({"--grpc-port=9001", "--model-repository", "/tmp/m", "--max-queue-delay-us", "0"})) << error_;
  EXPECT_EQ(f_.port, 9001);
  EXPECT_EQ(f_.repo, "/tmp/m");
  EXPECT_EQ(f_.delay, 0);
  ASSERT_TRUE(Parse({"--grpc-port", "-5"})) << error_;  // the next argument is the value, even if it looks like a flag
  EXPECT_EQ(f_.port, -5);
  ASSERT_TRUE(Parse({"--model-repository="})) << error_;
  EXPECT_EQ(f_.repo, "");
  ASSERT_TRUE(Parse({"--model-repository=a=b"})) << error_;
  EXPECT_EQ(f_.repo, "a=b") << "only the first '=' separates";
}

TEST_F(FlagsTest, LastValueWins) {
  ASSERT_TRUE(Parse({"--grpc-port=1", "--grpc-port=2"})) << error_;
  EXPECT_EQ(f_.port, 2);
}

TEST_F(FlagsTest, UnderscoresAccepted) {
  ASSERT_TRUE(Parse({"--grpc_port=7000", "--model_repository", "/x", "--max_queue-delay_us=3"})) << error_;
  EXPECT_EQ(f_.port, 7000);
  EXPECT_EQ(f_.repo, "/x");
  EXPECT_EQ(f_.delay, 3);
  EXPECT_EQ(f_.repo, "/x") << "values keep their underscores";
  ASSERT_TRUE(Parse({"--model-repository=/a_b"})) << error_;
  EXPECT_EQ(f_.repo, "/a_b") << "values keep their underscores";
}

TEST_F(FlagsTest, BoolForms) {
  ASSERT_TRUE(Parse({"--strict-model-config"})) << error_;
  EXPECT_TRUE(f_.strict);
  ASSERT_TRUE(Parse({"--strict-model-config=false"})) << error_;
  EXPECT_FALSE(f_.strict);
  ASSERT_TRUE(Parse({"--strict-model-config=1"})) << error_;
  EXPECT_TRUE(f_.strict);
  ASSERT_TRUE(Parse({"--batch-invariant=0"})) << error_;
  EXPECT_FALSE(f_.invariant);
  ASSERT_TRUE(Parse({"--batch_invariant=true"})) << error_;
  EXPECT_TRUE(f_.invariant);
  ASSERT_TRUE(Parse({"--no-batch-invariant"})) << error_;
  EXPECT_FALSE(f_.invariant) << "--no-NAME turns a switch off";
  EXPECT_FALSE(Parse({"--no-batch-invariant=true"})) << "--no-NAME takes no value";
  // A bare bool flag does not consume the next argument.
  ASSERT_TRUE(Parse({"--strict-model-config", "--grpc-port=5"})) << error_;
  EXPECT_TRUE(f_.strict);
  EXPECT_EQ(f_.port, 5);

  EXPECT_FALSE(Parse({"--strict-model-config=yes"}));
  EXPECT_NE(error_.find("--strict-model-config"), std::string::npos) << error_;
  EXPECT_NE(error_.find("true or false"), std::string::npos) << error_;
  EXPECT_NE(error_.find("'yes'"), std::string::npos) << error_;
}

TEST_F(FlagsTest, UnknownFlag) {
  EXPECT_FALSE(Parse({"--grpc-prot=1"}));
  EXPECT_NE(error_.find("unknown flag --grpc-prot"), std::string::npos) << error_;
  EXPECT_NE(error_.find("--help"), std::string::npos) << error_;
  EXPECT_FALSE(Parse({"stray"}));
  EXPECT_NE(error_.find("'stray'"), std::string::npos) << error_;
  EXPECT_FALSE(Parse({"-p", "1"})) << "single-dash flags are not flags";
}

TEST_F(FlagsTest, BadInteger) {
  for (const std::string v : {"abc", "12x", "", "1.5", "0x10"}) {
    EXPECT_FALSE(Parse({"--grpc-port=" + v})) << "accepted '" << v << "'";
    EXPECT_NE(error_.find("--grpc-port expects an integer"), std::string::npos) << error_;
    EXPECT_NE(error_.find("'" + v + "'"), std::string::npos) << error_;
  }
  EXPECT_FALSE(Parse({"--grpc-port=99999999999999999999"})) << "out of range for int64";
  EXPECT_NE(error_.find("--grpc-port"), std::string::npos) << error_;
  EXPECT_EQ(f_.port, 8001) << "a rejected value leaves the flag alone";
  EXPECT_FALSE(Parse({"--grpc-port"}));
  EXPECT_NE(error_.find("--grpc-port needs a value"), std::string::npos) << error_;
}

TEST_F(FlagsTest, Help) {
  ASSERT_TRUE(Parse({"--help"})) << error_;
  EXPECT_TRUE(help_);
  ASSERT_TRUE(Parse({"--grpc-port=1", "-h"})) << error_;
  EXPECT_TRUE(help_);
  const std::string h = set_.Help();
  EXPECT_EQ(h.rfind("usage: flashq-server [flags]", 0), 0u) << h;
  for (const char* part : {"--model-repository", "(default \"/models\")", "--grpc-port", "(default 8001)", "gRPC port",
                           "--strict-model-config", "(default false)", "--batch-invariant", "(default true)"}) {
    EXPECT_NE(h.find(part), std::string::npos) << "help lacks " << part << "\n" << h;
  }
}

TEST_F(FlagsTest, HelpShowsDefaultsNotParsedValues) {
  ASSERT_TRUE(Parse({"--grpc-port=1234"})) << error_;
  EXPECT_NE(set_.Help().find("(default 8001)"), std::string::npos);
}

}  // namespace
}  // namespace flashq::server
