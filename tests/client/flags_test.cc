// flashq-bench's use of the shared parser (common/flags.h): kept flags read back as text, --no-NAME,
// repeatable flags, -H for --header, and the sectioned help.
#include "common/flags.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace flashq {
namespace {

FlagSet Make() {
  FlagSet f("usage\n", FlagSet::HelpLayout::kSections);
  f.Add({"concurrency", "LIST", "1,4,16", "Closed loop.", "Load"});
  f.Add({"spawn-server", "", "false", "Start a server.", "Target"});
  f.Add({"causal", "", "true", "Causal.", "Shapes"});
  f.Add({"server-arg", "ARG", "", "Extra.", "Target", true});
  return f;
}

bool Parse(FlagSet& f, std::vector<std::string> args, std::string* error) {
  args.insert(args.begin(), "x");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return f.Parse(int(argv.size()), argv.data(), &help, error);
}

TEST(Flags, ParseForms) {
  FlagSet f = Make();
  std::string error;
  ASSERT_TRUE(Parse(f, {"--concurrency", "2,8", "--spawn-server", "--no-causal", "--server-arg=--a=1", "--server-arg=-b"},
                    &error))
      << error;
  EXPECT_EQ(f.Get("concurrency"), "2,8");
  EXPECT_TRUE(f.GetBool("spawn-server"));
  EXPECT_FALSE(f.GetBool("causal"));
  EXPECT_TRUE(f.WasSet("causal"));
  EXPECT_EQ(f.GetAll("server-arg"), (std::vector<std::string>{"--a=1", "-b"}));
}

TEST(Flags, DefaultsAndErrors) {
  FlagSet f = Make();
  std::string error;
  ASSERT_TRUE(Parse(f, {}, &error)) << error;
  EXPECT_EQ(f.Get("concurrency"), "1,4,16");
  EXPECT_TRUE(f.GetBool("causal"));
  const std::pair<std::string, std::string> bad[] = {
      {"--nope", "unknown flag --nope (see --help)"},
      {"--concurrency", "--concurrency needs a value (LIST)"},
      {"--causal=yes", "--causal takes true or false, not 'yes'"},
      {"stray", "unexpected argument 'stray' (see --help)"}};
  for (const auto& [arg, message] : bad) {
    FlagSet g = Make();
    EXPECT_FALSE(Parse(g, {arg}, &error)) << arg;
    EXPECT_EQ(error, message);
  }
}

TEST(Flags, HelpDocumentsEveryFlag) {
  FlagSet f = Make();
  const std::string help = f.Help();
  EXPECT_EQ(help.rfind("usage\n", 0), 0u) << help;
  for (const char* n : {"--concurrency=LIST", "--spawn-server", "--causal", "--server-arg=ARG", "[default: 1,4,16]",
                        "(repeatable)", "Load:", "Target:", "[default: on; --no-causal turns it off]"})
    EXPECT_NE(help.find(n), std::string::npos) << n;
}

TEST(Flags, ShortHeaderForm) {
  // perf_analyzer's -H 'name: value', separate or attached, is --header.
  FlagSet f = Make();
  f.Add({"header", "'NAME: VALUE'", "", "Metadata.", "Target", true});
  f.Short('H', "header");
  std::string error;
  ASSERT_TRUE(Parse(f, {"-H", "authorization: Bearer t", "-Hx-a:1", "--header=x-b: 2", "--server-arg", "-Hkept"}, &error))
      << error;
  EXPECT_EQ(f.GetAll("header"), (std::vector<std::string>{"authorization: Bearer t", "x-a:1", "x-b: 2"}));
  EXPECT_EQ(f.GetAll("server-arg"), (std::vector<std::string>{"-Hkept"}));
}

}  // namespace
}  // namespace flashq
