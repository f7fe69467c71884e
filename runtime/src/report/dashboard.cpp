// The live dashboard (see report.hpp): the report page of the running job's
// directory on 127.0.0.1. Each request reads the run directory afresh (the
// metrics file is synced at every step), so the page shows every step as soon
// as it is written; the timeline comes from the process's own tracer.
#include <httplib.h>

#include <chrono>
#include <thread>

#include "areal/runtime/report.hpp"
#include "areal/runtime/trace.hpp"

namespace areal::report {

struct dashboard::server {
  std::filesystem::path dir;
  std::shared_ptr<const tracer> trace;
  httplib::Server http;
  std::thread listener;
  int port = -1;

  // The data document, or an error message for the page to show as text.
  std::pair<int, std::string> data() const {
    try {
      return {200, report_data({dir}, {}, true, trace.get())};
    } catch (const std::exception& e) {
      return {500, e.what()};
    }
  }
};

dashboard::dashboard(std::filesystem::path run_directory, uint16_t port, std::shared_ptr<const tracer> trace)
    : server_(std::make_unique<server>()) {
  auto& s = *server_;
  s.dir = std::move(run_directory);
  s.trace = std::move(trace);
  s.http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.http.set_read_timeout(5, 0);
  s.http.set_write_timeout(5, 0);
  s.http.Get("/", [this](const httplib::Request&, httplib::Response& res) {
    auto [status, body] = server_->data();
    res.status = status;
    if (status == 200)
      res.set_content(page_html(body, true), "text/html; charset=utf-8");
    else
      res.set_content("the run directory cannot be read: " + body + "\n", "text/plain; charset=utf-8");
  });
  s.http.Get("/data.json", [this](const httplib::Request&, httplib::Response& res) {
    auto [status, body] = server_->data();
    res.status = status;
    res.set_content(body, status == 200 ? "application/json" : "text/plain; charset=utf-8");
  });
  // Not httplib's default options, whose SO_REUSEPORT would let a second server share a port in use.
  s.http.set_socket_options([](socket_t fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (!s.http.bind_to_port("127.0.0.1", port))
    throw std::runtime_error("the live dashboard cannot listen on 127.0.0.1:" + std::to_string(port) +
                             " (in use?); choose another run.dashboard_port, or 0 for none");
  s.port = port;
  s.listener = std::thread([this] { server_->http.listen_after_bind(); });
  // Serving before the constructor returns: a stop() before the loop began would not end it.
  for (int i = 0; i < 5000 && !s.http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

dashboard::~dashboard() {
  server_->http.stop();
  if (server_->listener.joinable())
    server_->listener.join();
}

std::string dashboard::address() const {
  return "http://127.0.0.1:" + std::to_string(server_->port) + "/";
}

}  // namespace areal::report
