// The trainer's checkpoints (trainer.hpp): the model in Hugging Face layout,
// optimizer moments, counters and RNG, written to a sibling directory and
// swapped in by rename; reading them back, and finding the complete one after
// a process died between the two renames.
#include "areal/kernels/trainer.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "areal/kernels/safetensors.hpp"
#include "areal/runtime/files.hpp"

namespace fs = std::filesystem;

namespace areal::kernels {

namespace {

constexpr int checkpoint_format = 1;

stored_tensor to_stored(const at::Tensor& t) {
  auto cpu = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
  stored_tensor s{dtype::f32, {cpu.numel()}, {}};
  auto bytes = static_cast<const char*>(cpu.data_ptr());
  s.data.assign(bytes, bytes + cpu.numel() * 4);
  return s;
}

}  // namespace

std::string trainer::complete_checkpoint(const std::string& directory) {
  if (fs::exists(fs::path{directory} / "trainer_state.json"))
    return directory;
  if (fs::exists(fs::path{directory + ".old"} / "trainer_state.json"))
    return directory + ".old";
  return {};
}

struct trainer::checkpoint_snapshot {
  tensor_map model;
  std::string model_config;
  tensor_map optimizer;
  std::string state;  // trainer_state.json
  std::map<std::string, std::string> extra_files;
  int64_t version = 0;
};

std::shared_ptr<const trainer::checkpoint_snapshot> trainer::snapshot_checkpoint(
    const std::map<std::string, std::string>& extra_files) const {
  auto s = std::make_shared<checkpoint_snapshot>();
  s->model = model_.to_tensors();
  s->model_config = to_config_json(model_.config());
  s->optimizer.emplace("adam_m", to_stored(adam_m_));
  s->optimizer.emplace("adam_v", to_stored(adam_v_));
  std::ostringstream rng;
  rng << rng_;
  nlohmann::json j = {{"format", checkpoint_format},        {"optimizer_step", step_},
                      {"policy_version", version_},         {"skipped_total", skipped_total_},
                      {"skipped_in_row", skipped_in_row_},  {"rng", rng.str()},
                      {"parameters", model_.flat().numel()}};
  s->state = j.dump(2) + "\n";
  s->extra_files = extra_files;
  s->version = version_;
  return s;
}

int64_t trainer::snapshot_version(const checkpoint_snapshot& snapshot) {
  return snapshot.version;
}

void trainer::save_checkpoint(const std::string& directory,
                              const std::map<std::string, std::string>& extra_files) const {
  write_checkpoint(directory, *snapshot_checkpoint(extra_files));
}

void trainer::write_checkpoint(const std::string& directory, const checkpoint_snapshot& snapshot) {
  // Write everything into a fresh sibling directory, then swap it into place:
  // at every moment either the old or the new checkpoint is complete on disk.
  // A write that fails (a full disk) removes the fresh one and keeps the old.
  fs::path target{directory};
  auto fresh = fs::path{directory + ".new"};
  auto old = fs::path{directory + ".old"};
  std::error_code ec;
  try {
    fs::remove_all(fresh);
    fs::create_directories(fresh / "model");
    kernels::write_checkpoint((fresh / "model").string(), snapshot.model);
    write_file_atomically(fresh / "model" / "config.json", snapshot.model_config);
    write_safetensors((fresh / "optimizer.safetensors").string(), snapshot.optimizer);
    for (auto& [name, contents] : snapshot.extra_files)
      write_file_atomically(fresh / name, contents);
    // Written last: its presence marks a complete checkpoint.
    write_file_atomically(fresh / "trainer_state.json", snapshot.state);
    sync_directory(fresh);
  } catch (const std::exception& e) {
    fs::remove_all(fresh, ec);
    throw training_error(std::string{"not written: "} + e.what());
  }
  fs::remove_all(old, ec);
  if (fs::exists(target))
    fs::rename(target, old);
  fs::rename(fresh, target);
  fs::remove_all(old, ec);
  sync_directory(target.parent_path().empty() ? fs::path{"."} : target.parent_path());
}

namespace {

// The trainer_state.json of a checkpoint directory.
nlohmann::json read_trainer_state(const fs::path& dir, const std::string& named) {
  std::ifstream in(dir / "trainer_state.json");
  if (!in)
    throw training_error(named + ": no trainer_state.json; not a trainer checkpoint");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw training_error((dir / "trainer_state.json").string() + ": " + e.what());
  }
  return j;
}

}  // namespace

int64_t trainer::checkpoint_version(const std::string& directory) {
  auto j = read_trainer_state(directory, directory);
  auto version = j.find("policy_version");
  if (version == j.end() || !version->is_number_integer())
    throw training_error(directory + "/trainer_state.json: no integer \"policy_version\"");
  return version->get<int64_t>();
}

void trainer::load_checkpoint(const std::string& directory) {
  auto complete = complete_checkpoint(directory);
  fs::path dir{complete.empty() ? directory : complete};
  auto j = read_trainer_state(dir, directory);
  if (j.value("format", 0) != checkpoint_format)
    throw training_error(dir.string() + ": checkpoint format " + std::to_string(j.value("format", 0)) +
                         ", this build reads format " + std::to_string(checkpoint_format));
  if (j.value("parameters", int64_t{0}) != model_.flat().numel())
    throw training_error(dir.string() + ": checkpoint of a model with " +
                         std::to_string(j.value("parameters", int64_t{0})) + " parameters, this model has " +
                         std::to_string(model_.flat().numel()));
  {
    at::NoGradGuard no_grad;
    model_.load_tensors(read_checkpoint((dir / "model").string()), (dir / "model").string());
    auto state = read_safetensors((dir / "optimizer.safetensors").string());
    for (auto [name, target] : {std::pair<const char*, at::Tensor*>{"adam_m", &adam_m_}, {"adam_v", &adam_v_}}) {
      auto it = state.find(name);
      if (it == state.end() || it->second.numel() != target->numel())
        throw training_error(dir.string() + ": optimizer state \"" + name + "\" is missing or has the wrong size");
      target->copy_(at::from_blob(it->second.data.data(), {it->second.numel()}, at::kFloat));
    }
  }
  step_ = j.at("optimizer_step").get<int64_t>();
  version_ = j.at("policy_version").get<int64_t>();
  skipped_total_ = j.value("skipped_total", int64_t{0});
  skipped_in_row_ = j.value("skipped_in_row", 0);
  std::istringstream rng(j.at("rng").get<std::string>());
  rng >> rng_;
}

}  // namespace areal::kernels
