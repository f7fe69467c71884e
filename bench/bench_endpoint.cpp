// bench_endpoint: what the OpenAI-compatible HTTP endpoint costs, measured side
// by side in one run. The same generations (a prompt of 32 token ids, up to
// 32 new tokens, sampled with a seed per request) go to the same rollout worker
// two ways, at 1, 16 and 64 concurrent clients:
//   - in-process: each client thread sends the worker a generation request
//     (a CAF request, what the controller does for built-in samples);
//   - HTTP: each client POSTs /v1/completions (prompt as token ids) over a
//     keep-alive loopback connection, through cpp-httplib, the JSON parser,
//     the endpoint's relay actor and the JSON response.
// Printed per level: requests/s and tokens/s both ways, their ratio, and the
// latency per request (median, p99) both ways with the difference HTTP adds.
// Usage: bench_endpoint [--quick] [--json FILE] [--threads N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>

#include <ATen/Parallel.h>
#include <caf/all.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "bench_common.hpp"

#include "areal/actors/endpoint.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/kernels/allocator.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/model.hpp"
#include "areal/runtime/config.hpp"
#include "areal/runtime/cpus.hpp"

using namespace areal;
using namespace areal::kernels;
using areal::bench::seconds_since;
using clock_type = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr int prompt_length = 32;
constexpr int new_tokens = 32;

std::vector<int32_t> prompt_of(uint64_t i, int64_t vocab) {
  std::vector<int32_t> p;
  for (int k = 0; k < prompt_length; ++k)
    p.push_back(static_cast<int32_t>(4 + (i * 7 + static_cast<uint64_t>(k) * 3) % static_cast<uint64_t>(vocab - 4)));
  return p;
}

struct level_result {
  double seconds = 0;
  int64_t requests = 0, tokens = 0, failed = 0;
  std::vector<double> latency_ms;
  double percentile(double q) {
    if (latency_ms.empty())
      return 0;
    std::sort(latency_ms.begin(), latency_ms.end());
    auto i = static_cast<size_t>(q * static_cast<double>(latency_ms.size() - 1));
    return latency_ms[i];
  }
};

// `clients` threads, each sending `per_client` requests one after another through `one`.
template <class Send>
level_result drive(int clients, int per_client, Send one) {
  level_result r;
  std::mutex m;
  std::atomic<int64_t> tokens{0}, failed{0};
  auto start = clock_type::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      std::vector<double> mine;
      auto state = one.open();
      for (int i = 0; i < per_client; ++i) {
        auto id = static_cast<uint64_t>(c * per_client + i);
        auto t0 = clock_type::now();
        auto n = one.send(state, id);
        mine.push_back(seconds_since(t0) * 1000);
        if (n < 0)
          failed++;
        else
          tokens += n;
      }
      std::lock_guard<std::mutex> lock{m};
      r.latency_ms.insert(r.latency_ms.end(), mine.begin(), mine.end());
    });
  for (auto& t : threads)
    t.join();
  r.seconds = seconds_since(start);
  r.requests = static_cast<int64_t>(clients) * per_client;
  r.tokens = tokens;
  r.failed = failed;
  return r;
}

struct in_process {
  caf::actor_system& sys;
  rollout_actor worker;
  int64_t vocab;
  int32_t eos;  // the endpoint stops a completion at it: so does this side
  std::unique_ptr<caf::scoped_actor> open() const { return std::make_unique<caf::scoped_actor>(sys); }
  int64_t send(std::unique_ptr<caf::scoped_actor>& self, uint64_t id) const {
    generation_request g;
    g.prompt_id = id;
    g.prompt_tokens = prompt_of(id, vocab);
    g.sampling.max_new_tokens = new_tokens;
    g.sampling.stop_tokens = {eos};
    g.seed = id + 1;
    int64_t n = -1;
    (*self)->request(worker, std::chrono::seconds(120), *pack(g))
        .receive([&](packed<trajectory>& t, std::string&) { auto u = unpack(t); n = u ? static_cast<int64_t>(u->output_tokens.size()) : -1; },
                 [&](caf::error&) {});
    return n;
  }
};

struct over_http {
  uint16_t port;
  int64_t vocab;
  std::unique_ptr<httplib::Client> open() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_keep_alive(true);
    c->set_read_timeout(120, 0);
    return c;
  }
  int64_t send(std::unique_ptr<httplib::Client>& c, uint64_t id) const {
    json body = {{"model", "areal"},
                 {"prompt", prompt_of(id, vocab)},
                 {"max_tokens", new_tokens},
                 {"seed", id + 1},
                 {"temperature", 1.0}};
    auto r = c->Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200)
      return -1;
    auto j = json::parse(r->body, nullptr, false);
    if (j.is_discarded())
      return -1;
    return j["usage"]["completion_tokens"].get<int64_t>();
  }
};

}  // namespace

int main(int argc, char** argv) {
  kernels::tune_allocator();
  auto opts = bench::parse_options(argc, argv, "bench_endpoint");
  int threads = std::max(1, opts.threads);
  areal::kernels::set_compute_threads(threads);
  spdlog::set_level(spdlog::level::warn);
  auto facts = kernels::probe_blas();

  std::string ascii = "\n\t";
  for (char ch = ' '; ch <= '~'; ++ch)
    ascii += ch;
  auto tok = std::make_shared<const tokenizer>(
      tokenizer::character_level(ascii, {"<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"}));
  auto config = kernels::preset("tiny", tok->vocab_size());
  auto model = std::make_shared<policy_model>(config);
  model->init_random(1, 0.02);
  std::cout << "bench_endpoint: " << threads << " compute threads (" << areal::cpus().describe() << "); "
            << kernels::describe(facts) << "; tiny preset (" << model->flat().numel() << " parameters); prompt "
            << prompt_length << " ids, up to " << new_tokens << " new tokens" << (opts.quick ? "; --quick" : "")
            << "\n";

  caf::actor_system_config cfg;
  configure_actor_system(cfg, cluster_spec{"bench"});
  caf::actor_system sys{cfg};
  rollout_setup rs;
  rs.name = "rollout-bench";
  rs.model = model;
  rs.tokenizer = tok;
  rs.engine = {64, 256, 512};
  rs.compute_threads = threads;
  auto worker = spawn_rollout(sys, rs);
  endpoint_setup es;
  es.rollouts = {worker};
  es.tokenizer = tok;
  es.eos = *tok->token_id("<|endoftext|>");
  es.max_seq_len = 256;
  es.threads = 80;
  es.no_chat_reason = "completions only";
  auto endpoint = std::make_unique<http_endpoint>(sys, es);

  in_process direct{sys, worker, tok->vocab_size(), *tok->token_id("<|endoftext|>")};
  over_http http{endpoint->port(), tok->vocab_size()};
  json report = {{"threads", threads}, {"blas", kernels::describe(facts)}, {"quick", opts.quick}};
  drive(4, 2, direct);  // warm-up: allocations, the first JIT-free pass
  drive(4, 2, http);
  std::cout << std::fixed << std::setprecision(1);
  for (int clients : {1, 16, 64}) {
    int per_client = std::max(2, (opts.quick ? 64 : 256) / clients);
    if (clients == 1)
      per_client = opts.quick ? 8 : 24;
    // Side by side, twice each in alternation; the better of each pair is kept (noise only slows).
    level_result a = drive(clients, per_client, direct), b = drive(clients, per_client, http);
    level_result a2 = drive(clients, per_client, direct), b2 = drive(clients, per_client, http);
    if (a2.seconds < a.seconds)
      a = a2;
    if (b2.seconds < b.seconds)
      b = b2;
    double a_rps = static_cast<double>(a.requests) / a.seconds, b_rps = static_cast<double>(b.requests) / b.seconds;
    double a_tps = static_cast<double>(a.tokens) / a.seconds, b_tps = static_cast<double>(b.tokens) / b.seconds;
    auto a50 = a.percentile(0.5), a99 = a.percentile(0.99), b50 = b.percentile(0.5), b99 = b.percentile(0.99);
    std::cout << clients << " client(s), " << b.requests << " requests each way:\n"
              << "  in-process: " << a_rps << " req/s, " << a_tps << " tok/s; latency median " << a50 << " ms, p99 "
              << a99 << " ms\n"
              << "  HTTP:       " << b_rps << " req/s, " << b_tps << " tok/s; latency median " << b50 << " ms, p99 "
              << b99 << " ms" << (b.failed ? " (" + std::to_string(b.failed) + " failed)" : "") << "\n"
              << std::setprecision(3) << "  HTTP / in-process: " << b_rps / a_rps << "x requests/s, " << b_tps / a_tps
              << "x tokens/s; added latency median " << std::setprecision(1) << b50 - a50 << " ms, p99 " << b99 - a99
              << " ms\n";
    report["levels"].push_back({{"clients", clients},
                                {"requests", b.requests},
                                {"in_process_rps", a_rps},
                                {"http_rps", b_rps},
                                {"in_process_tps", a_tps},
                                {"http_tps", b_tps},
                                {"ratio_rps", b_rps / a_rps},
                                {"added_latency_median_ms", b50 - a50},
                                {"added_latency_p99_ms", b99 - a99},
                                {"http_failed", b.failed}});
  }
  endpoint->stop();
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
  if (!opts.json_path.empty())
    std::ofstream(opts.json_path) << report.dump(2) << "\n";
  return 0;
}
