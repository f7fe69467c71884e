// A .safetensors file's bytes: the tensors or a format_error naming the file.
#include <cstdint>

#include "areal/kernels/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> metadata;
  try {
    auto tensors = areal::kernels::parse_safetensors(reinterpret_cast<const char*>(data), size, "fuzz.safetensors",
                                                     &metadata);
    for (auto& [name, t] : tensors)
      if (static_cast<uint64_t>(t.numel()) * areal::element_size(t.type) != t.data.size())
        __builtin_trap();  // every tensor holds exactly its shape's bytes
  } catch (const areal::kernels::format_error&) {
  }
  return 0;
}
