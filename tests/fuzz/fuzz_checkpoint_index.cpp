// A model.safetensors.index.json: the shards to read, each a bare file name
// in the checkpoint's directory, or a format_error.
#include <cstdint>

#include "areal/kernels/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto shards = areal::kernels::parse_checkpoint_index({reinterpret_cast<const char*>(data), size}, "index.json");
    for (auto& [file, names] : shards)
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos || names.empty())
        __builtin_trap();  // never a path out of the directory
  } catch (const areal::kernels::format_error&) {
  }
  return 0;
}
