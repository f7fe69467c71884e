// The Gloo link (gloo_link.hpp) in a build without Gloo's headers: LibTorch
// carries c10d's Gloo process group compiled in, but PyTorch's LibTorch ships
// no headers of Gloo itself, and c10d's header needs them (actors/CMakeLists.txt,
// AREAL_GLOO). Here every part of a link throws, saying so; the weight
// publisher and subscriber then move weights as CAF messages.
#include "gloo_link.hpp"

#include <stdexcept>

namespace areal {

namespace {

[[noreturn]] void no_gloo() {
  throw std::runtime_error(gloo_absent_reason());
}

}  // namespace

bool gloo_available() {
  return false;
}

const char* gloo_absent_reason() {
  return "this build has no Gloo link (Gloo's headers were not found beside LibTorch's when it was configured; to "
         "have it, install the headers of the Gloo your LibTorch was built with (Debian: libgloo-dev) and configure "
         "again, or set cluster.weight_transport = \"caf\")";
}

struct gloo_rendezvous::impl {};
struct gloo_link::impl {};

gloo_rendezvous::gloo_rendezvous(const std::string& host, std::chrono::milliseconds) : host_(host) {
  no_gloo();
}
gloo_rendezvous::~gloo_rendezvous() = default;
uint16_t gloo_rendezvous::port() const {
  no_gloo();
}
const std::string& gloo_rendezvous::secret() const {
  no_gloo();
}
uint64_t gloo_rendezvous::refused() const {
  no_gloo();
}
void gloo_rendezvous::abandon(const std::string&) {}

gloo_link::gloo_link(gloo_rendezvous&, const std::string&, std::chrono::milliseconds) {
  no_gloo();
}
gloo_link::gloo_link(const std::string&, uint16_t, const std::string&, const std::string&, const std::string&,
                     std::chrono::milliseconds) {
  no_gloo();
}
gloo_link::~gloo_link() = default;
void gloo_link::send_version(const weight_manifest&, const at::Tensor*, chunk_sums*, const chunk_tamper&) {
  no_gloo();
}
bool gloo_link::receive_version(const weight_manifest&, at::Tensor&, std::vector<uint64_t>&) {
  no_gloo();
}
void gloo_link::send(const at::Tensor&, int) {
  no_gloo();
}
void gloo_link::recv(at::Tensor&, int) {
  no_gloo();
}
size_t gloo_link::post_send(const at::Tensor&, int) {
  no_gloo();
}
size_t gloo_link::post_recv(at::Tensor&, int) {
  no_gloo();
}
void gloo_link::wait(size_t) {
  no_gloo();
}
void gloo_link::clear_posted() {}

}  // namespace areal
