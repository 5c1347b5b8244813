// Command-line flags of flashq-server and flashq-bench: one table per program, which is also its
// --help text, so every flag is documented by construction. No dependencies, so that the server and
// the client (which must not depend on server/) both link it.
//
// Accepted forms: --name=value and --name value (the next argument is the value even if it starts
// with '-'); a switch is --name, --name=true|false|1|0 or --no-name; --some_name is --some-name, as
// in Triton's tools. -h and --help stop parsing and ask for the help. A program may add one-letter
// spellings: flashq-bench's -H 'name: value' (or -H'name: value') is perf_analyzer's and curl's --header.
// Anything else that is not a flag is an error: neither program takes positional arguments.
//
// A flag either writes a typed variable as it is parsed (flashq-server: an integer is refused outside
// its range before anything sizes itself with it) or keeps its text for the program to read back with
// Get/GetAll/GetBool (flashq-bench, which validates its values where it uses them).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace flashq {

// A flag whose text the program reads back.
struct FlagSpec {
  std::string name;
  std::string value_name = {};  // empty: a switch
  std::string default_value = {};
  std::string help = {};
  std::string section = {};  // the heading it is listed under in the kSections help
  bool repeatable = false;
};

class FlagSet {
 public:
  // kBlocks: "  --name (default D, lo..hi)\n      help" per flag (flashq-server, as Triton prints its
  // flags). kSections: the flags under their sections' headings, help in a column wrapped at about
  // 100 characters (flashq-bench).
  enum class HelpLayout { kBlocks, kSections };
  explicit FlagSet(std::string usage, HelpLayout layout = HelpLayout::kBlocks)
      : usage_(std::move(usage)), layout_(layout) {}

  // Typed flags; the variable's value when added is the default.
  void Add(std::string name, std::string* target, std::string help);
  // An integer flag is refused outside [lo, hi], before anything sizes itself with it.
  void Add(std::string name, int64_t* target, std::string help, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
  void Add(std::string name, bool* target, std::string help);
  // A repeatable flag: each occurrence appends its value (an empty value, the default, appends nothing).
  void Add(std::string name, std::vector<std::string>* target, std::string help);
  // A flag that keeps its text.
  void Add(FlagSpec spec);
  // A second spelling of an added flag: it sets the same flag, and WasSet(name) sees it.
  void Alias(std::string alias, const std::string& name);
  // -<letter> is --<name>: "-L v" is "--name v", and "-Lv" is "--name=v".
  void Short(char letter, std::string name);

  // Returns false and fills `error` on a bad flag; sets `help` on --help or -h.
  bool Parse(int argc, char** argv, bool* help, std::string* error);
  std::string Help() const;

  // Whether the command line named the flag (also when it gave the default's value).
  bool WasSet(const std::string& name) const;
  // A kept flag's last value, or its default.
  std::string Get(const std::string& name) const;
  // Every value of a repeatable kept flag, in order.
  std::vector<std::string> GetAll(const std::string& name) const;
  bool GetBool(const std::string& name) const { return Get(name) == "true"; }

 private:
  using Target = std::variant<std::monostate, std::string*, int64_t*, bool*, std::vector<std::string>*>;
  struct Flag {
    FlagSpec spec;
    Target target = {};
    std::string shown_default = {};  // kBlocks: "\"text\"", 8001, true
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    std::vector<std::string> aliases = {};
    std::vector<std::string> values = {};  // kept flags: what the command line gave
    bool set = false;
    bool IsSwitch() const;
  };
  Flag* Find(const std::string& name);
  const Flag* Find(const std::string& name) const;
  bool Set(Flag& f, const std::string& value, bool has_value, std::string* error);
  std::string BlocksHelp() const;
  std::string SectionsHelp() const;

  std::string usage_;
  HelpLayout layout_;
  std::vector<Flag> flags_;
  std::vector<std::pair<char, std::string>> shorts_;
};

}  // namespace flashq
