// Reader and writer of the safetensors format (Hugging Face): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {...}}, then the raw little-endian data.
// Also sharded checkpoints: model-0000i-of-0000n.safetensors with a
// model.safetensors.index.json weight map. Everything read is checked; a bad
// file raises format_error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "areal/kernels/model_config.hpp"
#include "areal/messages/records.hpp"

namespace areal::kernels {

struct stored_tensor {
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  std::vector<char> data;  // little-endian elements
  int64_t numel() const;
};

using tensor_map = std::map<std::string, stored_tensor>;

/// Reads one .safetensors file.
tensor_map read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

/// Reads a .safetensors file's bytes (`path` names them in errors).
tensor_map parse_safetensors(const char* data, size_t size, const std::string& path,
                             std::map<std::string, std::string>* metadata = nullptr);

/// Writes one .safetensors file (atomically: a temporary file renamed into place).
void write_safetensors(const std::string& path, const tensor_map& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a checkpoint directory: model.safetensors, or the
/// shards listed by model.safetensors.index.json.
tensor_map read_checkpoint(const std::string& directory);

/// The weight map of a model.safetensors.index.json text: shard file -> its tensors.
std::map<std::string, std::vector<std::string>> parse_checkpoint_index(std::string_view text, const std::string& path);

/// Writes the tensors as model.safetensors, or as shards of at most
/// `max_shard_bytes` with an index when they do not fit in one.
void write_checkpoint(const std::string& directory, const tensor_map& tensors, uint64_t max_shard_bytes = 5ull << 30);

/// "F32" <-> dtype::f32 and so on.
dtype parse_dtype(const std::string& name, const std::string& where);

}  // namespace areal::kernels
