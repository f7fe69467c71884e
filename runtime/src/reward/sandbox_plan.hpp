// A run's plan on its way to the supervisor program (internal): the host
// (sandbox.cpp) writes it to a pipe, areal-sandbox-supervisor
// (sandbox_supervisor_main.cpp) reads it back. JSON of what the processes
// inside use: the programs' argv, the limits, the isolation asked for, the
// users, the work directory and the descriptors' numbers.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "sandbox_inside.hpp"

namespace areal::reward::inside {

/// Moves with every change of the plan's fields: a supervisor of another
/// build refuses a plan of another format instead of misreading it.
constexpr int plan_format = 1;

std::string encode_plan(const child_plan& plan, pid_t host);

/// A decoded plan and what it points to.
struct received_plan {
  sandbox_request request;
  sandbox_policy policy;
  child_plan plan{};
  pid_t host = 0;  // the process that started the supervisor
};

/// Throws std::invalid_argument saying what is wrong with `text`.
std::unique_ptr<received_plan> decode_plan(const std::string& text);

}  // namespace areal::reward::inside
