// The checks of a configuration document (see config_checks.hpp).
#include "config_checks.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <variant>

namespace areal::config_checks {

std::string context::where(const toml::node* n, const toml::source_region* region) const {
  if (n) {
    auto i = origins.find(n);
    if (i != origins.end())
      return i->second;
  }
  const toml::source_region& r = region ? *region : n->source();
  if (r.begin.line == 0)
    return source;
  return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

void context::fail(std::string location, const std::string& path, const std::string& what) {
  errors.push_back(std::move(location) + ": " + path + ": " + what);
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "a boolean";
    default:
      return "a date/time";
  }
}

std::string format_number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string list(const std::vector<std::string>& xs) {
  std::string out;
  for (auto& x : xs)
    out += (out.empty() ? "" : ", ") + x;
  return out;
}

// -- --set overrides -----------------------------------------------------------

namespace {

// Splits "nodes[1].port" / "nodes.worker.port" into steps.
std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> steps;
  std::string current;
  for (char c : path) {
    if (c == '.' || c == '[' || c == ']') {
      if (!current.empty())
        steps.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty())
    steps.push_back(current);
  return steps;
}

// Every node of a --set value is reported against the command line, an array's entries and a
// table's values too (their source positions are in the value's own text, not the file's).
void mark_origin(toml::node& n, const std::string& origin, context& ctx) {
  ctx.origins[&n] = origin;
  if (auto* arr = n.as_array())
    for (auto& e : *arr)
      mark_origin(e, origin, ctx);
  else if (auto* t = n.as_table())
    for (auto&& [key, value] : *t)
      mark_origin(value, origin, ctx);
}

}  // namespace

void apply_override(toml::table& root, const std::string& text, context& ctx) {
  auto eq = text.find('=');
  std::string origin = "--set " + text;
  if (eq == std::string::npos || eq == 0) {
    ctx.errors.push_back(origin + ": expected KEY=VALUE, e.g. --set cluster.connect_timeout_s=10");
    return;
  }
  auto path = text.substr(0, eq);
  auto value_text = text.substr(eq + 1);
  auto steps = split_path(path);
  // The value is TOML when it parses as such, else a bare string (--set run.name=demo).
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value_text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value_text}};
  }
  if (!parsed.get("v") || parsed.size() != 1)
    parsed = toml::table{{"v", value_text}};

  toml::table* table = &root;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    auto& step = steps[i];
    auto* child = table->get(step);
    if (!child) {
      table->insert(step, toml::table{});
      child = table->get(step);
    }
    if (auto* arr = child->as_array()) {
      // Next step picks an entry: by index or by its `name`.
      if (i + 2 >= steps.size()) {
        ctx.errors.push_back(origin + ": '" + step + "' is an array of tables; name an entry and a key, e.g. " + step +
                             "[0].KEY or " + step + ".NAME.KEY");
        return;
      }
      auto& pick = steps[++i];
      toml::table* entry = nullptr;
      if (all_digits(pick)) {
        // Compared as text first: std::stoul throws on an index past 64 bits.
        if (pick.size() <= 9 && std::stoul(pick) < arr->size())
          entry = (*arr)[std::stoul(pick)].as_table();
      } else {
        for (auto& e : *arr)
          if (auto* t = e.as_table())
            if (auto name = (*t)["name"].value<std::string>(); name && *name == pick)
              entry = t;
      }
      if (!entry) {
        ctx.errors.push_back(origin + ": no entry '" + pick + "' in '" + step + "' (it has " +
                             std::to_string(arr->size()) + " entries; use an index from 0 or an entry's name)");
        return;
      }
      table = entry;
    } else if (auto* t = child->as_table()) {
      table = t;
    } else {
      ctx.errors.push_back(origin + ": '" + step + "' is " + type_name(*child) + ", not a table");
      return;
    }
  }
  if (steps.empty()) {
    ctx.errors.push_back(origin + ": empty key");
    return;
  }
  table->insert_or_assign(steps.back(), std::move(*parsed.get("v")));
  mark_origin(*table->get(steps.back()), origin, ctx);
}

// -- checking one table against its fields ------------------------------------

void check_table(toml::table& table, const settings::section& section, const std::string& prefix, context& ctx) {
  for (auto&& [key, value] : table) {
    std::string_view name = key.str();  // C++17 lambdas cannot capture a structured binding
    auto known = std::any_of(section.settings.begin(), section.settings.end(),
                             [&](const settings::setting& f) { return name == f.key; });
    if (!known) {
      std::vector<std::string> names;
      for (auto& f : section.settings)
        names.emplace_back(f.key);
      ctx.fail(ctx.where(&value, &key.source()), prefix + std::string{key.str()},
               "unknown key; the keys of [" + std::string{section.name} + "] are: " + list(names));
    }
  }
  for (auto& f : section.settings) {
    auto path = prefix + f.key;
    auto* node = table.get(f.key);
    if (!node) {
      if (f.required) {
        ctx.fail(ctx.where(&table), path, std::string{"missing required key ("} + f.doc + "); add " + f.key + " = ...");
        continue;
      }
      auto fallback = f.fallback();
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::vector<std::string>>) {
              toml::array arr;
              for (auto& s : x)
                arr.push_back(s);
              table.insert(f.key, std::move(arr));
            } else if constexpr (!std::is_same_v<T, std::monostate>) {
              table.insert(f.key, x);
            }
          },
          fallback);
      continue;
    }
    auto wrong_type = [&] {
      ctx.fail(ctx.where(node), path,
               std::string{"expected "} + settings::to_string(f.type) + ", got " + type_name(*node));
    };
    auto check_range = [&](double x) {
      if (x < f.min || x > f.max || std::isnan(x))
        ctx.fail(ctx.where(node), path,
                 "value " + format_number(x) + " is out of range; use a value in [" + format_number(f.min) + ", " +
                     format_number(f.max) + "]");
    };
    auto check_choice = [&](const std::string& s, const toml::node* at) {
      if (!f.one_of.empty() && std::find(f.one_of.begin(), f.one_of.end(), s) == f.one_of.end())
        ctx.fail(ctx.where(at), path, "unknown value \"" + s + "\"; use one of: " + list(f.one_of));
    };
    switch (f.type) {
      case settings::kind::boolean:
        if (!node->is_boolean())
          wrong_type();
        break;
      case settings::kind::integer:
        if (!node->is_integer())
          wrong_type();
        else
          check_range(static_cast<double>(node->as_integer()->get()));
        break;
      case settings::kind::number:
        if (node->is_integer()) {  // 30 where 30.0 is meant
          auto x = static_cast<double>(node->as_integer()->get());
          table.insert_or_assign(f.key, x);
          auto origin = ctx.origins.find(node);
          node = table.get(f.key);
          if (origin != ctx.origins.end())
            ctx.origins[node] = origin->second;
        }
        if (!node->is_floating_point())
          wrong_type();
        else
          check_range(node->as_floating_point()->get());
        break;
      case settings::kind::string:
        if (!node->is_string())
          wrong_type();
        else if (node->as_string()->get().empty())
          ctx.fail(ctx.where(node), path, "must not be empty");
        else
          check_choice(node->as_string()->get(), node);
        break;
      case settings::kind::string_list:
        if (!node->is_array()) {
          wrong_type();
          break;
        }
        if (node->as_array()->empty() && f.required)
          ctx.fail(ctx.where(node), path, "must not be empty; use one or more of: " + list(f.one_of));
        for (auto& item : *node->as_array()) {
          if (!item.is_string())
            ctx.fail(ctx.where(&item), path, "expected strings only, got " + type_name(item));
          else
            check_choice(item.as_string()->get(), &item);
        }
        break;
    }
  }
}

}  // namespace areal::config_checks
