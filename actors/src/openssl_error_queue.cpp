// Works around CAF 0.17's OpenSSL sessions, which call SSL_get_error without
// clearing the thread's OpenSSL error queue first. When one TLS connection
// fails (a node killed with SIGKILL), its error stays queued and the next
// SSL_read of every other connection served by the same multiplexer thread
// reads as failed: one lost node took every node's connection down with it.
// OpenSSL's rule (SSL_get_error(3)): the queue must be empty before a TLS I/O
// call. These definitions interpose the TLS I/O calls for the whole process
// (libcaf_openssl binds to the executable's symbols first) and clear the
// queue before forwarding to libssl.
#include <dlfcn.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace {

template <class F>
F next_symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto real = next_symbol<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto real = next_symbol<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_connect(SSL* ssl) {
  static auto real = next_symbol<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

int SSL_accept(SSL* ssl) {
  static auto real = next_symbol<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_shutdown(SSL* ssl) {
  static auto real = next_symbol<int (*)(SSL*)>("SSL_shutdown");
  ERR_clear_error();
  return real(ssl);
}

}  // extern "C"

namespace areal {
// Referenced by configure_actor_system so that the linker keeps this file.
void keep_openssl_error_queue_fix() {}
}  // namespace areal
