// Writes the binary seeds of the fuzz corpora: each record type's encoding of
// the tests' sample records, a small safetensors file and a tokenizer.json.
// Run once from the repository root (build/fuzz/make_seeds tests/fuzz/corpus);
// its output is committed, so the corpora need no build to exist.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "areal/kernels/safetensors.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/messages/codec.hpp"
#include "sample_records.hpp"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& file, const std::vector<char>& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream{file, std::ios::binary}.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::cout << file.string() << " (" << bytes.size() << " bytes)\n";
}

template <class T>
void record(const fs::path& corpus, const char* name, const T& sample) {
  write(corpus / (std::string{"record_"} + name) / "sample", *areal::encode(sample));
  write(corpus / (std::string{"record_"} + name) / "default", *areal::encode(T{}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_seeds CORPUS_DIR\n";
    return 2;
  }
  fs::path corpus = argv[1];
  using namespace areal::test;
  record(corpus, "generation_request", sample_request());
  record(corpus, "trajectory", sample_trajectory());
  record(corpus, "weight_manifest", sample_manifest());
  record(corpus, "reward_task", sample_task());
  record(corpus, "node_hello", sample_hello());
  record(corpus, "node_stats", sample_stats());
  record(corpus, "run_state", sample_run_state());

  areal::kernels::tensor_map tensors;
  tensors["w"] = {areal::dtype::f32, {2, 2}, std::vector<char>(16, 1)};
  tensors["b"] = {areal::dtype::bf16, {3}, std::vector<char>(6, 2)};
  auto tmp = fs::temp_directory_path() / "areal_seed.safetensors";
  areal::kernels::write_safetensors(tmp.string(), tensors, {{"format", "pt"}});
  std::ifstream in{tmp, std::ios::binary};
  write(corpus / "safetensors" / "two_tensors", {std::istreambuf_iterator<char>{in}, {}});
  fs::remove(tmp);

  auto tok = areal::kernels::tokenizer::character_level("abc0123456789+= ", {"<unk>", "<|im_end|>"});
  auto json = tok.to_json();
  json += '\0';
  json += "ab+12 <|im_end|>";
  write(corpus / "tokenizer" / "character_level", {json.begin(), json.end()});
  return 0;
}
