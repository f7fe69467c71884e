// The table of settings: every key of the configuration with its type,
// range, choices, meaning and the member of run_config (or node_spec) it
// fills. Defaults are read from a default-constructed run_config, so that the
// member initializers in config.hpp are the only place they are written.
// Validation, extraction and `areal --help-config` all come from this table.
// Internal to runtime/.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include <toml++/toml.h>

#include "areal/runtime/config.hpp"

namespace areal::settings {

enum class kind { boolean, integer, number, string, string_list };
const char* to_string(kind k);

/// A value as the table knows it; monostate: none (a required key has no default).
using value = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<std::string>>;

struct setting {
  const char* key;
  kind type;
  double min = -INFINITY;
  double max = INFINITY;
  std::vector<std::string> one_of = {};  // for strings and string lists
  const char* doc = "";
  bool required = false;
  // The member it fills: of run_config for a section, of node_spec for [[nodes]].
  std::function<value(const run_config&)> get;
  std::function<void(run_config&, const toml::node&)> set;
  std::function<value(const node_spec&)> get_node;
  std::function<void(node_spec&, const toml::node&)> set_node;

  /// The default (from run_config{} or node_spec{}); monostate when required.
  value fallback() const;
};

struct section {
  const char* name;
  bool array_of_tables;  // [[name]] entries
  const char* doc;
  std::vector<setting> settings;
};

const std::vector<section>& table();

/// The run configuration of a validated TOML document (every key present, checked).
run_config extract(const toml::table& root, const std::string& source);

}  // namespace areal::settings
