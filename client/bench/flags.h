// A small command-line parser whose flag table is also the --help text, so that
// every flag is documented by construction. Accepts --name=value, --name value,
// and --flag / --no-flag for booleans; -h is --help and -H is --header.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace flashq::bench {

struct FlagSpec {
  std::string name;
  std::string value_name;  // empty: a boolean switch
  std::string default_value;
  std::string help;
  std::string section;
  bool repeatable = false;
};

class Flags {
 public:
  void Add(FlagSpec spec);
  absl::Status Parse(int argc, char** argv);
  std::string Help(const std::string& usage) const;

  bool IsSet(const std::string& name) const { return set_.count(name) > 0; }
  std::string Get(const std::string& name) const;
  std::vector<std::string> GetAll(const std::string& name) const;  // repeatable flags
  bool GetBool(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  const FlagSpec* Find(const std::string& name) const;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::vector<std::string>> set_;
  std::vector<std::string> positional_;
};

}  // namespace flashq::bench
