// Configuration loading: parse TOML, apply --set overrides, check every key
// against the table of settings (settings.cpp), fill in defaults, then check
// the rules that span keys (config_checks.cpp), and extract the run_config.
#include "areal/runtime/config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <variant>

#include <toml++/toml.h>

#include "config_checks.hpp"
#include "settings.hpp"

namespace areal {

using namespace config_checks;

// -- roles --------------------------------------------------------------------

namespace {
constexpr role all_roles[] = {role::controller, role::trainer, role::rollout, role::reward};
}

const char* to_string(role x) {
  switch (x) {
    case role::controller:
      return "controller";
    case role::trainer:
      return "trainer";
    case role::rollout:
      return "rollout";
    case role::reward:
      return "reward";
  }
  return "unknown";
}

std::optional<role> parse_role(std::string_view name) {
  for (auto r : all_roles)
    if (name == to_string(r))
      return r;
  return std::nullopt;
}

std::optional<std::vector<role>> parse_roles(std::string_view text, std::string* bad) {
  std::vector<role> out;
  while (!text.empty()) {
    auto comma = text.find(',');
    auto item = text.substr(0, comma);
    auto r = parse_role(item);
    if (!r) {
      if (bad)
        *bad = std::string{item};
      return std::nullopt;
    }
    if (std::find(out.begin(), out.end(), *r) == out.end())
      out.push_back(*r);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  if (out.empty()) {
    if (bad)
      *bad = "";
    return std::nullopt;
  }
  return out;
}

std::string join(const std::vector<role>& roles) {
  std::string out;
  for (auto r : roles) {
    if (!out.empty())
      out += ',';
    out += to_string(r);
  }
  return out;
}

bool node_spec::has(role x) const {
  return std::find(roles.begin(), roles.end(), x) != roles.end();
}

const node_spec* run_config::find_node(std::string_view name) const {
  for (auto& n : nodes)
    if (n.name == name)
      return &n;
  return nullptr;
}

const node_spec& run_config::controller_node() const {
  for (auto& n : nodes)
    if (n.has(role::controller))
      return n;
  // Validation guarantees exactly one controller node.
  return nodes.front();
}

namespace {

config_result validate(toml::table root, const std::string& source, const std::vector<std::string>& overrides) {
  context ctx;
  ctx.source = source;
  for (auto& o : overrides)
    apply_override(root, o, ctx);
  if (!ctx.errors.empty())
    return {std::nullopt, ctx.errors};
  for (auto&& [key, value] : root) {
    auto& sections = settings::table();
    std::string_view name = key.str();  // C++17 lambdas cannot capture a structured binding
    if (std::none_of(sections.begin(), sections.end(), [&](auto& s) { return name == s.name; })) {
      std::vector<std::string> names;
      for (auto& s : sections)
        names.emplace_back(s.name);
      ctx.fail(ctx.where(&value, &key.source()), std::string{key.str()},
               "unknown section; the sections are: " + list(names));
    }
  }
  for (auto& section : settings::table()) {
    std::string name = section.name;
    if (!section.array_of_tables) {
      if (!root.get(name))
        root.insert(name, toml::table{});
      auto* table = root[name].as_table();
      if (!table) {
        ctx.fail(ctx.where(root.get(name)), name, "expected a table [" + name + "], got " + type_name(*root.get(name)));
        continue;
      }
      check_table(*table, section, name + ".", ctx);
      continue;
    }
    auto* node = root.get(name);
    if (!node) {
      ctx.fail(source, name, "missing; add at least one [[" + name + "]] entry (" + section.doc + ")");
      continue;
    }
    auto* arr = node->as_array();
    if (!arr || !arr->is_array_of_tables() || arr->empty()) {
      ctx.fail(ctx.where(node), name, "expected one or more [[" + name + "]] tables, got " + type_name(*node));
      continue;
    }
    for (size_t i = 0; i < arr->size(); ++i)
      check_table(*(*arr)[i].as_table(), section, name + "[" + std::to_string(i) + "].", ctx);
  }
  if (ctx.errors.empty())
    check_rules(root, ctx);
  if (!ctx.errors.empty())
    return {std::nullopt, ctx.errors};
  return {settings::extract(root, source), {}};
}

}  // namespace

config_result parse_config(std::string_view text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    auto& b = e.source().begin;
    return {std::nullopt,
            {source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
             ": TOML syntax error: " + std::string{e.description()}}};
  }
  return validate(std::move(root), source_name, overrides);
}

config_result load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return {std::nullopt,
            {path + ": is a directory; --config takes a TOML file, e.g. " +
             (std::filesystem::path{path} / "single_node.toml").string() + " (examples are in configs/)"}};
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return {std::nullopt,
            {path +
             ": cannot open the configuration file; pass an existing file with --config (examples are in configs/)"}};
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return {std::nullopt, {path + ": cannot read the configuration file"}};
  return parse_config(text.str(), path, overrides);
}

std::string describe_config_schema() {
  std::ostringstream os;
  for (auto& s : settings::table()) {
    os << (s.array_of_tables ? "[[" : "[") << s.name << (s.array_of_tables ? "]]" : "]") << "  # " << s.doc << "\n";
    for (auto& f : s.settings) {
      os << "  " << f.key << " : " << settings::to_string(f.type);
      if (f.required)
        os << ", required";
      auto fallback = f.fallback();
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::string>)
              os << ", default \"" << x << "\"";
            else if constexpr (std::is_same_v<T, bool>)
              os << ", default " << (x ? "true" : "false");
            else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
              os << ", default " << x;
          },
          fallback);
      if (std::isfinite(f.min) || std::isfinite(f.max))
        os << ", in [" << format_number(f.min) << ", " << format_number(f.max) << "]";
      if (!f.one_of.empty())
        os << ", of: " << list(f.one_of);
      os << "\n      " << f.doc << "\n";
    }
  }
  return os.str();
}

}  // namespace areal
