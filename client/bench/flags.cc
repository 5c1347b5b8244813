#include "client/bench/flags.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace flashq::bench {

void Flags::Add(FlagSpec spec) { specs_.push_back(std::move(spec)); }

const FlagSpec* Flags::Find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

absl::Status Flags::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h") arg = "--help";
    // perf_analyzer's and curl's short form of --header: -H 'name: value' or -H'name: value'.
    if (arg == "-H") arg = "--header";
    else if (arg.rfind("-H", 0) == 0) arg = "--header=" + arg.substr(2);
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const FlagSpec* spec = Find(name);
    if (!spec && name.rfind("no-", 0) == 0) {
      const FlagSpec* neg = Find(name.substr(3));
      if (neg && neg->value_name.empty() && !has_value) {
        set_[neg->name] = {"false"};
        continue;
      }
    }
    if (!spec) return absl::InvalidArgumentError(absl::StrFormat("unknown flag --%s (see --help)", name));
    if (spec->value_name.empty()) {
      if (!has_value) value = "true";
      if (value != "true" && value != "false" && value != "1" && value != "0")
        return absl::InvalidArgumentError(absl::StrFormat("--%s takes true or false, not '%s'", name, value));
      set_[name] = {value == "true" || value == "1" ? "true" : "false"};
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value (%s)", name, spec->value_name));
      value = argv[++i];
    }
    if (spec->repeatable) set_[name].push_back(value);
    else set_[name] = {value};
  }
  return absl::OkStatus();
}

std::string Flags::Get(const std::string& name) const {
  auto it = set_.find(name);
  if (it != set_.end() && !it->second.empty()) return it->second.back();
  const FlagSpec* s = Find(name);
  return s ? s->default_value : "";
}

std::vector<std::string> Flags::GetAll(const std::string& name) const {
  auto it = set_.find(name);
  return it == set_.end() ? std::vector<std::string>{} : it->second;
}

bool Flags::GetBool(const std::string& name) const { return Get(name) == "true"; }

std::string Flags::Help(const std::string& usage) const {
  std::string out = usage;
  std::string section;
  for (const auto& s : specs_) {
    if (s.section != section) {
      section = s.section;
      absl::StrAppend(&out, "\n", section, ":\n");
    }
    std::string lhs = absl::StrCat("  --", s.name);
    if (!s.value_name.empty()) absl::StrAppend(&lhs, "=", s.value_name);
    std::string help = s.help;
    if (!s.value_name.empty() && !s.default_value.empty()) absl::StrAppend(&help, " [default: ", s.default_value, "]");
    if (s.value_name.empty()) absl::StrAppend(&help, s.default_value == "true" ? " [default: on; --no-" + s.name + " turns it off]" : "");
    if (s.repeatable) absl::StrAppend(&help, " (repeatable)");
    // Wrap the help text at about 100 columns, indented under the flag.
    std::vector<std::string> words = absl::StrSplit(help, ' ', absl::SkipEmpty());
    std::string line = lhs.size() < 30 ? lhs + std::string(30 - lhs.size(), ' ') : lhs + "\n" + std::string(30, ' ');
    size_t col = line.size() - (line.rfind('\n') == std::string::npos ? 0 : line.rfind('\n') + 1);
    for (const auto& w : words) {
      if (col + w.size() + 1 > 104 && col > 30) {
        while (!line.empty() && line.back() == ' ') line.pop_back();
        absl::StrAppend(&line, "\n", std::string(30, ' '));
        col = 30;
      }
      absl::StrAppend(&line, w, " ");
      col += w.size() + 1;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace flashq::bench
