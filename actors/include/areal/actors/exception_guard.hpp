// The last line of defence of every actor of the job: an exception that
// escapes a handler ends the actor with an error that carries its text, so the
// job (which monitors every actor) ends the run saying what went wrong,
// instead of CAF's bare "unhandled_exception".
#pragma once

#include <exception>
#include <string>

#include <caf/error.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/sec.hpp>

namespace areal {

/// Installs the guard on `self`; `who` names the actor in the error.
inline void guard_exceptions(caf::scheduled_actor* self, std::string who) {
  self->set_exception_handler([who = std::move(who)](caf::scheduled_actor*, std::exception_ptr& thrown) {
    std::string what = "an exception of unknown type";
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    return caf::make_error(caf::sec::runtime_error, who + ": unhandled exception: " + what);
  });
}

}  // namespace areal
