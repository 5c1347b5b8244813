// Command-line flags in Triton's spelling (--grpc-port=8001 or --grpc-port 8001).
// A small table-driven parser: each flag has a name, a help line and a typed target.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace flashq::server {

class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}
  void Add(std::string name, std::string* target, std::string help);
  // An integer flag is refused outside [lo, hi], before anything sizes itself with it.
  void Add(std::string name, int64_t* target, std::string help, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
  void Add(std::string name, bool* target, std::string help);
  // A repeatable flag: each occurrence appends its value (an empty value, the default,
  // appends nothing).
  void Add(std::string name, std::vector<std::string>* target, std::string help);
  // A second spelling of an added flag: it sets the same target, and WasSet(name) sees it.
  void Alias(std::string alias, const std::string& name);
  // Returns false and fills `error` on a bad flag; sets `help` on --help.
  bool Parse(int argc, char** argv, bool* help, std::string* error);
  std::string Help() const;
  // Whether the command line named the flag (also when it gave the default's value).
  bool WasSet(const std::string& name) const;

 private:
  struct Flag {
    std::string name, help, def;
    std::variant<std::string*, int64_t*, bool*, std::vector<std::string>*> target;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    bool set = false;
    std::vector<std::string> aliases = {};
  };
  bool Set(Flag& f, const std::string& value, std::string* error);
  std::string usage_;
  std::vector<Flag> flags_;
};

}  // namespace flashq::server
