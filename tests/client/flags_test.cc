#include "client/bench/flags.h"

#include <gtest/gtest.h>

namespace flashq::bench {
namespace {

Flags Make() {
  Flags f;
  f.Add({"concurrency", "LIST", "1,4,16", "Closed loop.", "Load"});
  f.Add({"spawn-server", "", "false", "Start a server.", "Target"});
  f.Add({"causal", "", "true", "Causal.", "Shapes"});
  f.Add({"server-arg", "ARG", "", "Extra.", "Target", true});
  return f;
}

TEST(Flags, ParseForms) {
  Flags f = Make();
  const char* argv[] = {"x", "--concurrency", "2,8", "--spawn-server", "--no-causal", "--server-arg=--a=1", "--server-arg=-b"};
  ASSERT_TRUE(f.Parse(7, const_cast<char**>(argv)).ok());
  EXPECT_EQ(f.Get("concurrency"), "2,8");
  EXPECT_TRUE(f.GetBool("spawn-server"));
  EXPECT_FALSE(f.GetBool("causal"));
  EXPECT_TRUE(f.IsSet("causal"));
  EXPECT_EQ(f.GetAll("server-arg"), (std::vector<std::string>{"--a=1", "-b"}));
}

TEST(Flags, DefaultsAndErrors) {
  Flags f = Make();
  const char* ok[] = {"x"};
  ASSERT_TRUE(f.Parse(1, const_cast<char**>(ok)).ok());
  EXPECT_EQ(f.Get("concurrency"), "1,4,16");
  EXPECT_TRUE(f.GetBool("causal"));
  Flags g = Make();
  const char* bad[] = {"x", "--nope"};
  EXPECT_FALSE(g.Parse(2, const_cast<char**>(bad)).ok());
  Flags h = Make();
  const char* missing[] = {"x", "--concurrency"};
  EXPECT_FALSE(h.Parse(2, const_cast<char**>(missing)).ok());
}

TEST(Flags, HelpDocumentsEveryFlag) {
  Flags f = Make();
  const std::string help = f.Help("usage\n");
  for (const char* n : {"--concurrency=LIST", "--spawn-server", "--causal", "--server-arg=ARG", "[default: 1,4,16]",
                        "(repeatable)", "Load:", "Target:"})
    EXPECT_NE(help.find(n), std::string::npos) << n;
}

TEST(Flags, ShortHeaderForm) {
  // perf_analyzer's -H 'name: value', separate or attached, is --header.
  Flags f = Make();
  f.Add({"header", "'NAME: VALUE'", "", "Metadata.", "Target", true});
  const char* argv[] = {"x", "-H", "authorization: Bearer t", "-Hx-a:1", "--header=x-b: 2", "--server-arg", "-Hkept"};
  ASSERT_TRUE(f.Parse(7, const_cast<char**>(argv)).ok());
  EXPECT_EQ(f.GetAll("header"), (std::vector<std::string>{"authorization: Bearer t", "x-a:1", "x-b: 2"}));
  EXPECT_EQ(f.GetAll("server-arg"), (std::vector<std::string>{"-Hkept"}));
}

}  // namespace
}  // namespace flashq::bench
