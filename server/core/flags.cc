#include "server/core/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace flashq::server {

void FlagSet::Add(std::string name, std::string* target, std::string help) {
  flags_.push_back({std::move(name), std::move(help), "\"" + *target + "\"", target});
}
void FlagSet::Add(std::string name, int64_t* target, std::string help, int64_t lo, int64_t hi) {
  flags_.push_back({std::move(name), std::move(help), std::to_string(*target), target, lo, hi});
}
void FlagSet::Add(std::string name, bool* target, std::string help) {
  flags_.push_back({std::move(name), std::move(help), *target ? "true" : "false", target});
}

void FlagSet::Add(std::string name, std::vector<std::string>* target, std::string help) {
  flags_.push_back({std::move(name), std::move(help) + " Repeatable.", "\"\"", target});
}

void FlagSet::Alias(std::string alias, const std::string& name) {
  for (auto& f : flags_) {
    if (f.name == name) f.aliases.push_back(std::move(alias));
  }
}

bool FlagSet::Set(Flag& f, const std::string& value, std::string* error) {
  if (auto* s = std::get_if<std::string*>(&f.target)) {
    **s = value;
    return true;
  }
  if (auto* list = std::get_if<std::vector<std::string>*>(&f.target)) {
    if (!value.empty()) (*list)->push_back(value);  // the default: nothing added
    return true;
  }
  if (auto* i = std::get_if<int64_t*>(&f.target)) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno == ERANGE) {  // ERANGE: strtoll clamps out-of-range values
      *error = "--" + f.name + " expects an integer, got '" + value + "'";
      return false;
    }
    if (v < f.lo || v > f.hi) {
      *error = "--" + f.name + "=" + value + " is out of range; it must be in " + std::to_string(f.lo) + ".." +
               std::to_string(f.hi);
      return false;
    }
    **i = v;
    return true;
  }
  bool* b = std::get<bool*>(f.target);
  if (value == "true" || value == "1" || value.empty()) *b = true;
  else if (value == "false" || value == "0") *b = false;
  else {
    *error = "--" + f.name + " expects true or false, got '" + value + "'";
    return false;
  }
  return true;
}

bool FlagSet::Parse(int argc, char** argv, bool* help, std::string* error) {
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return true;
    }
    if (arg.rfind("--", 0) != 0) {
      *error = "unexpected argument '" + arg + "'";
      return false;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    for (char& c : name) c = c == '_' ? '-' : c;  // --grpc_port works too
    Flag* flag = nullptr;
    for (auto& f : flags_) {
      if (f.name == name || std::find(f.aliases.begin(), f.aliases.end(), name) != f.aliases.end()) flag = &f;
    }
    if (!flag) {
      *error = "unknown flag --" + name + " (see --help)";
      return false;
    }
    if (!has_value && !std::holds_alternative<bool*>(flag->target)) {
      if (i + 1 >= argc) {
        *error = "--" + name + " needs a value";
        return false;
      }
      value = argv[++i];
    }
    if (!Set(*flag, value, error)) return false;
    flag->set = true;
  }
  return true;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

std::string FlagSet::Help() const {
  std::string out = usage_ + "\n\nFlags:\n";
  for (const auto& f : flags_) {
    std::string range;
    if (f.lo != INT64_MIN || f.hi != INT64_MAX) range = ", " + std::to_string(f.lo) + ".." + std::to_string(f.hi);
    std::string also;
    for (const auto& a : f.aliases) also += (also.empty() ? " Also spelled --" : ", --") + a;
    if (!also.empty()) also += ".";
    out += "  --" + f.name + " (default " + f.def + range + ")\n      " + f.help + also + "\n";
  }
  return out;
}

}  // namespace flashq::server
