// The plan's JSON (see sandbox_plan.hpp).
#include "sandbox_plan.hpp"

#include <stdexcept>

#include <nlohmann/json.hpp>

namespace areal::reward::inside {

std::string encode_plan(const child_plan& plan, pid_t host) {
  auto& r = *plan.request;
  auto& p = *plan.policy;
  nlohmann::json j{
      {"format", plan_format},
      {"host", host},
      {"argv", r.argv},
      {"limits",
       {{"wall_s", r.limits.wall_s},
        {"cpu_s", r.limits.cpu_s},
        {"memory_bytes", r.limits.memory_bytes},
        {"file_bytes", r.limits.file_bytes},
        {"processes", r.limits.processes},
        {"open_files", r.limits.open_files},
        {"output_bytes", r.limits.output_bytes}}},
      {"namespaces", p.namespaces},
      {"seccomp", p.seccomp},
      {"read_only_dirs", p.read_only_dirs},
      {"work_dir", plan.work_dir},
      {"switch_users", plan.switch_users},
      {"users", {plan.uid, plan.gid, plan.companion_uid, plan.companion_gid}},
      {"descriptors", {plan.stdin_read, plan.stdout_write, plan.stderr_write, plan.status_write}},
  };
  if (r.companion)
    j["companion_argv"] = r.companion->argv;
  return j.dump();
}

std::unique_ptr<received_plan> decode_plan(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object())
    throw std::invalid_argument("the plan is not a JSON object");
  if (j.value("format", 0) != plan_format)
    throw std::invalid_argument(
        "the plan's format is " + std::to_string(j.value("format", 0)) + ", this supervisor reads " +
        std::to_string(plan_format) +
        " (a supervisor of another build: install this build's, or set AREAL_HELPER_DIR to its libexec/areal)");
  auto out = std::make_unique<received_plan>();
  try {
    auto& r = out->request;
    r.argv = j.at("argv").get<std::vector<std::string>>();
    auto& l = j.at("limits");
    r.limits.wall_s = l.at("wall_s").get<double>();
    r.limits.cpu_s = l.at("cpu_s").get<double>();
    r.limits.memory_bytes = l.at("memory_bytes").get<uint64_t>();
    r.limits.file_bytes = l.at("file_bytes").get<uint64_t>();
    r.limits.processes = l.at("processes").get<uint64_t>();
    r.limits.open_files = l.at("open_files").get<uint64_t>();
    r.limits.output_bytes = l.at("output_bytes").get<size_t>();
    if (j.contains("companion_argv"))
      r.companion = sandbox_companion{j.at("companion_argv").get<std::vector<std::string>>(), {}};
    auto& p = out->policy;
    p.namespaces = j.at("namespaces").get<bool>();
    p.seccomp = j.at("seccomp").get<bool>();
    p.read_only_dirs = j.at("read_only_dirs").get<std::vector<std::string>>();
    auto& plan = out->plan;
    plan.request = &out->request;
    plan.policy = &out->policy;
    plan.work_dir = j.at("work_dir").get<std::string>();
    plan.switch_users = j.at("switch_users").get<bool>();
    auto users = j.at("users").get<std::vector<uint32_t>>();
    auto fds = j.at("descriptors").get<std::vector<int>>();
    if (users.size() != 4 || fds.size() != 4)
      throw std::invalid_argument("four users and four descriptors expected");
    plan.uid = users[0];
    plan.gid = users[1];
    plan.companion_uid = users[2];
    plan.companion_gid = users[3];
    plan.stdin_read = fds[0];
    plan.stdout_write = fds[1];
    plan.stderr_write = fds[2];
    plan.status_write = fds[3];
    for (int& fd : plan.host_ends)
      fd = -1;  // the host's ends never reach the supervisor program (close-on-exec)
    out->host = j.at("host").get<pid_t>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string{"the plan is malformed: "} + e.what());
  }
  return out;
}

}  // namespace areal::reward::inside
