#include "common/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace flashq {

bool FlagSet::Flag::IsSwitch() const {
  return std::holds_alternative<bool*>(target) ||
         (std::holds_alternative<std::monostate>(target) && spec.value_name.empty());
}

void FlagSet::Add(std::string name, std::string* target, std::string help) {
  flags_.push_back({{std::move(name), "", *target, std::move(help)}, target, "\"" + *target + "\""});
}
void FlagSet::Add(std::string name, int64_t* target, std::string help, int64_t lo, int64_t hi) {
  std::string def = std::to_string(*target);
  flags_.push_back({{std::move(name), "", def, std::move(help)}, target, def, lo, hi});
}
void FlagSet::Add(std::string name, bool* target, std::string help) {
  std::string def = *target ? "true" : "false";
  flags_.push_back({{std::move(name), "", def, std::move(help)}, target, def});
}
void FlagSet::Add(std::string name, std::vector<std::string>* target, std::string help) {
  flags_.push_back({{std::move(name), "", "", std::move(help) + " Repeatable.", "", true}, target, "\"\""});
}
void FlagSet::Add(FlagSpec spec) { flags_.push_back({std::move(spec), std::monostate{}}); }

void FlagSet::Alias(std::string alias, const std::string& name) {
  if (Flag* f = Find(name)) f->aliases.push_back(std::move(alias));
}

void FlagSet::Short(char letter, std::string name) { shorts_.emplace_back(letter, std::move(name)); }

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (auto& f : flags_) {
    if (f.spec.name == name || std::find(f.aliases.begin(), f.aliases.end(), name) != f.aliases.end()) return &f;
  }
  return nullptr;
}
const FlagSet::Flag* FlagSet::Find(const std::string& name) const { return const_cast<FlagSet*>(this)->Find(name); }

bool FlagSet::Set(Flag& f, const std::string& value, bool has_value, std::string* error) {
  const std::string& name = f.spec.name;
  if (std::holds_alternative<std::monostate>(f.target)) {  // a kept flag
    if (!f.IsSwitch()) {
      if (f.spec.repeatable) f.values.push_back(value);
      else f.values = {value};
      return true;
    }
    const std::string v = has_value ? value : "true";
    if (v != "true" && v != "false" && v != "1" && v != "0") {
      *error = "--" + name + " takes true or false, not '" + v + "'";
      return false;
    }
    f.values = {v == "true" || v == "1" ? "true" : "false"};
    return true;
  }
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
      *error = "--" + name + " expects an integer, got '" + value + "'";
      return false;
    }
    if (v < f.lo || v > f.hi) {
      *error = "--" + name + "=" + value + " is out of range; it must be in " + std::to_string(f.lo) + ".." +
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
    *error = "--" + name + " expects true or false, got '" + value + "'";
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
    if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
      for (const auto& [letter, long_name] : shorts_) {
        if (arg[1] != letter) continue;
        arg = arg.size() == 2 ? "--" + long_name : "--" + long_name + "=" + arg.substr(2);
        break;
      }
    }
    if (arg.rfind("--", 0) != 0) {
      *error = "unexpected argument '" + arg + "' (see --help)";
      return false;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    std::replace(name.begin(), name.end(), '_', '-');
    Flag* flag = Find(name);
    if (!flag && name.rfind("no-", 0) == 0 && !has_value) {  // --no-NAME turns switch NAME off
      if (Flag* neg = Find(name.substr(3)); neg && neg->IsSwitch()) {
        flag = neg;
        value = "false";
        has_value = true;
      }
    }
    if (!flag) {
      *error = "unknown flag --" + name + " (see --help)";
      return false;
    }
    if (!has_value && !flag->IsSwitch()) {
      if (i + 1 >= argc) {
        *error = "--" + name + " needs a value" +
                 (flag->spec.value_name.empty() ? "" : " (" + flag->spec.value_name + ")");
        return false;
      }
      value = argv[++i];
      has_value = true;
    }
    if (!Set(*flag, value, has_value, error)) return false;
    flag->set = true;
  }
  return true;
}

bool FlagSet::WasSet(const std::string& name) const {
  const Flag* f = Find(name);
  return f && f->set;
}

std::string FlagSet::Get(const std::string& name) const {
  const Flag* f = Find(name);
  if (!f) return "";
  return f->values.empty() ? f->spec.default_value : f->values.back();
}

std::vector<std::string> FlagSet::GetAll(const std::string& name) const {
  const Flag* f = Find(name);
  return f ? f->values : std::vector<std::string>{};
}

std::string FlagSet::Help() const { return layout_ == HelpLayout::kBlocks ? BlocksHelp() : SectionsHelp(); }

std::string FlagSet::BlocksHelp() const {
  std::string out = usage_ + "\n\nFlags:\n";
  for (const auto& f : flags_) {
    std::string range;
    if (f.lo != INT64_MIN || f.hi != INT64_MAX) range = ", " + std::to_string(f.lo) + ".." + std::to_string(f.hi);
    std::string also;
    for (const auto& a : f.aliases) also += (also.empty() ? " Also spelled --" : ", --") + a;
    if (!also.empty()) also += ".";
    out += "  --" + f.spec.name + " (default " + f.shown_default + range + ")\n      " + f.spec.help + also + "\n";
  }
  return out;
}

std::string FlagSet::SectionsHelp() const {
  constexpr size_t kIndent = 30, kWidth = 104;
  std::string out = usage_;
  std::string section;
  for (const auto& f : flags_) {
    const FlagSpec& s = f.spec;
    if (s.section != section) {
      section = s.section;
      out += "\n" + section + ":\n";
    }
    std::string lhs = "  --" + s.name;
    if (!s.value_name.empty()) lhs += "=" + s.value_name;
    std::string help = s.help;
    if (!s.value_name.empty() && !s.default_value.empty()) help += " [default: " + s.default_value + "]";
    if (s.value_name.empty() && s.default_value == "true") help += " [default: on; --no-" + s.name + " turns it off]";
    if (s.repeatable) help += " (repeatable)";
    // The help in a column under kIndent, wrapped at kWidth.
    std::string line = lhs.size() < kIndent ? lhs + std::string(kIndent - lhs.size(), ' ')
                                            : lhs + "\n" + std::string(kIndent, ' ');
    size_t col = kIndent;
    size_t start = 0;
    while (start < help.size()) {
      size_t end = help.find(' ', start);
      if (end == std::string::npos) end = help.size();
      const std::string word = help.substr(start, end - start);
      start = end + 1;
      if (word.empty()) continue;
      if (col + word.size() + 1 > kWidth && col > kIndent) {
        while (!line.empty() && line.back() == ' ') line.pop_back();
        line += "\n" + std::string(kIndent, ' ');
        col = kIndent;
      }
      line += word + " ";
      col += word.size() + 1;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace flashq
