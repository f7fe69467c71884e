#include "areal/kernels/safetensors.hpp"
#include "areal/runtime/files.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace areal::kernels {

int64_t stored_tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

dtype parse_dtype(const std::string& name, const std::string& where) {
  for (auto t : {dtype::f32, dtype::bf16, dtype::f16, dtype::i64, dtype::i32, dtype::u8})
    if (name == to_string(t))
      return t;
  throw format_error(where + ": unknown dtype \"" + name + "\" (supported: F32, BF16, F16, I64, I32, U8)");
}

namespace {

// A shard is a file beside its index: a bare name, not a path and not "." or "..".
bool is_shard_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::vector<char> read_file(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw format_error(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw format_error(path + ": cannot open");
  in.seekg(0, std::ios::end);
  auto size = static_cast<size_t>(in.tellg());
  in.seekg(0);
  std::vector<char> bytes(size);
  if (size > 0 && !in.read(bytes.data(), static_cast<std::streamsize>(size)))
    throw format_error(path + ": read failed");
  return bytes;
}

void write_atomically(const std::string& path, const std::vector<std::pair<const char*, size_t>>& parts) {
  std::vector<std::string_view> views;
  for (auto& [data, size] : parts)
    views.emplace_back(data, size);
  try {
    write_file_atomically(path, views);
  } catch (const file_error& e) {
    throw format_error(e.what());
  }
}

}  // namespace

tensor_map read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  auto bytes = read_file(path);
  return parse_safetensors(bytes.data(), bytes.size(), path, metadata);
}

tensor_map parse_safetensors(const char* data, size_t size, const std::string& path,
                             std::map<std::string, std::string>* metadata) {
  std::string_view bytes{data, size};
  if (bytes.size() < 8)
    throw format_error(path + ": too short to be a safetensors file (" + std::to_string(bytes.size()) + " bytes)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (header_len > bytes.size() - 8 || header_len > (100u << 20))
    throw format_error(path + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                       std::to_string(bytes.size()) + " bytes): not a safetensors file, or truncated");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, header_len));
  } catch (const nlohmann::json::exception& e) {
    throw format_error(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object())
    throw format_error(path + ": header is not a JSON object");
  size_t data_start = 8 + header_len;
  size_t data_size = bytes.size() - data_start;
  tensor_map out;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;  // data [begin, end) of each tensor
  for (auto& [name, entry] : header.items()) {
    auto where = path + ": tensor \"" + name + "\"";
    if (name == "__metadata__") {
      if (metadata && entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string())
            (*metadata)[k] = v.get<std::string>();
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets") ||
        !entry["dtype"].is_string() || !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      throw format_error(where + ": entry needs dtype, shape and data_offsets [begin, end]");
    stored_tensor t;
    t.type = parse_dtype(entry["dtype"].get<std::string>(), where);
    uint64_t numel = 1;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        throw format_error(where + ": shape must hold non-negative integers");
      t.shape.push_back(d.get<int64_t>());
      if (t.shape.back() != 0 && numel > (uint64_t{1} << 40) / static_cast<uint64_t>(t.shape.back()))
        throw format_error(where + ": shape is impossibly large");
      numel *= static_cast<uint64_t>(t.shape.back());
    }
    auto& offsets = entry["data_offsets"];
    for (auto& o : offsets)
      if (!o.is_number_unsigned())
        throw format_error(where + ": data_offsets must be non-negative integers, not " + o.dump());
    auto begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      throw format_error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") lie outside the " + std::to_string(data_size) + "-byte data section (truncated file?)");
    if (end - begin != numel * element_size(t.type))
      throw format_error(where + ": " + std::to_string(end - begin) + " bytes of data for shape with " +
                         std::to_string(numel) + " elements of " + to_string(t.type));
    t.data.assign(data + data_start + begin, data + data_start + end);
    spans.push_back({begin, end, name});
    out.emplace(name, std::move(t));
  }
  // Each tensor owns its bytes: two that share some are a damaged or forged file.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (std::get<0>(spans[i]) < std::get<1>(spans[i - 1]))
      throw format_error(path + ": tensors \"" + std::get<2>(spans[i - 1]) + "\" and \"" + std::get<2>(spans[i]) +
                         "\" overlap in the data section; the file is damaged");
  return out;
}

void write_safetensors(const std::string& path, const tensor_map& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    if (static_cast<uint64_t>(t.numel()) * element_size(t.type) != t.data.size())
      throw format_error(path + ": tensor \"" + name + "\" has " + std::to_string(t.data.size()) +
                         " bytes, its shape needs " +
                         std::to_string(t.numel() * static_cast<int64_t>(element_size(t.type))));
    header[name] = {
        {"dtype", to_string(t.type)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  auto text = header.dump();
  while ((8 + text.size()) % 8 != 0)  // align the data section as the reference writer does
    text += ' ';
  char length[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::vector<std::pair<const char*, size_t>> parts{{length, 8}, {text.data(), text.size()}};
  for (auto& [name, t] : tensors)
    parts.emplace_back(t.data.data(), t.data.size());
  write_atomically(path, parts);
}

std::map<std::string, std::vector<std::string>> parse_checkpoint_index(std::string_view text,
                                                                      const std::string& path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw format_error(path + ": not valid JSON: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw format_error(path + ": missing \"weight_map\"");
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || !is_shard_name(file.get<std::string>()))
      throw format_error(path + ": tensor \"" + name + "\" maps to an invalid shard name " + file.dump() +
                         " (a file name in the checkpoint's directory)");
    by_file[file.get<std::string>()].push_back(name);
  }
  return by_file;
}

tensor_map read_checkpoint(const std::string& directory) {
  auto index_path = fs::path{directory} / "model.safetensors.index.json";
  auto single = fs::path{directory} / "model.safetensors";
  if (!fs::exists(index_path)) {
    if (!fs::exists(single))
      throw format_error(directory + ": neither model.safetensors nor model.safetensors.index.json is there");
    return read_safetensors(single.string());
  }
  auto text = read_file(index_path.string());
  tensor_map out;
  for (auto& [file, names] : parse_checkpoint_index({text.data(), text.size()}, index_path.string())) {
    auto shard = read_safetensors((fs::path{directory} / file).string());
    for (auto& name : names) {
      auto it = shard.find(name);
      if (it == shard.end())
        throw format_error((fs::path{directory} / file).string() + ": tensor \"" + name +
                           "\" is listed in the index but missing from this shard");
      out.emplace(name, std::move(it->second));
    }
  }
  return out;
}

void write_checkpoint(const std::string& directory, const tensor_map& tensors, uint64_t max_shard_bytes) {
  fs::create_directories(directory);
  std::vector<tensor_map> shards(1);
  uint64_t current = 0, total = 0;
  for (auto& [name, t] : tensors) {
    if (current > 0 && current + t.data.size() > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().emplace(name, t);
    current += t.data.size();
    total += t.data.size();
  }
  if (shards.size() == 1) {
    write_safetensors((fs::path{directory} / "model.safetensors").string(), shards[0], {{"format", "pt"}});
    fs::remove(fs::path{directory} / "model.safetensors.index.json");
    return;
  }
  nlohmann::json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((fs::path{directory} / file).string(), shards[i], {{"format", "pt"}});
    for (auto& [name, t] : shards[i])
      index["weight_map"][name] = file;
  }
  auto text = index.dump(2) + "\n";
  write_atomically((fs::path{directory} / "model.safetensors.index.json").string(), {{text.data(), text.size()}});
}

}  // namespace areal::kernels
