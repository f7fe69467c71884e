// The checks of a configuration document: where a value came from (file:line:col
// or the --set that set it), --set overrides, one table's keys against the table
// of settings (defaults filled in), and the rules that span keys. Internal to runtime/.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "settings.hpp"

namespace areal::config_checks {

struct context {
  std::string source;                                // file name
  std::map<const toml::node*, std::string> origins;  // nodes set from the command line
  std::vector<std::string> errors;

  std::string where(const toml::node* n, const toml::source_region* region = nullptr) const;
  void fail(std::string location, const std::string& path, const std::string& what);
};

std::string type_name(const toml::node& n);
std::string format_number(double x);
std::string list(const std::vector<std::string>& xs);
/// Whether `s` is one or more decimal digits.
bool all_digits(const std::string& s);

/// Applies one --set KEY=VALUE to the document.
void apply_override(toml::table& root, const std::string& text, context& ctx);
/// Checks a table against its section's settings and fills in the defaults.
void check_table(toml::table& table, const settings::section& section, const std::string& prefix, context& ctx);
/// The rules that span keys (topology, batch and group, what this build supports): config_rules.cpp.
void check_rules(toml::table& root, context& ctx);

}  // namespace areal::config_checks
