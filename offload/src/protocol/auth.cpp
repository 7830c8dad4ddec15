#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/log.hpp"
#include "offload/protocol_auth.hpp"

namespace dlop::offload::protocol {

namespace {

Digest hmac(std::string_view token, std::string_view label, const Nonce& server, const Nonce& client) {
  Bytes message(label.begin(), label.end());
  message.insert(message.end(), server.begin(), server.end());
  message.insert(message.end(), client.begin(), client.end());
  Digest out{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(), out.data(),
           &length) == nullptr ||
      length != out.size()) {
    throw_error(Errc::kSystem, "OpenSSL could not compute an HMAC-SHA256");
  }
  return out;
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    throw_error(Errc::kSystem, "OpenSSL's RAND_bytes failed: no entropy for a nonce");
  }
  return n;
}

Digest hello_proof(std::string_view token, const Nonce& server, const Nonce& client) {
  return hmac(token, "dlop-offload hello", server, client);
}

bool proof_matches(const Digest& a, const Digest& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

SessionKeys session_keys(std::string_view token, const Nonce& server, const Nonce& client) {
  return SessionKeys{hmac(token, "dlop-offload c2s", server, client), hmac(token, "dlop-offload s2c", server, client)};
}

std::string read_token_file(const std::filesystem::path& path, bool strict) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw_error(Errc::kInvalidArgument, "token file " + path.string() + ": " + std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    const std::string what = "token file " + path.string() + " is accessible to group or others (mode " +
                             fmt::format("{:o}", st.st_mode & 0777) + "); chmod 600 it";
    if (strict) throw_error(Errc::kInvalidArgument, what);
    log().warn("{}", what);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(Errc::kInvalidArgument, "token file " + path.string() + " cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())) != 0) token.pop_back();
  if (token.size() < kMinTokenBytes) {
    throw_error(Errc::kInvalidArgument, "token file " + path.string() + " holds " + std::to_string(token.size()) +
                                            " bytes; a token needs at least " + std::to_string(kMinTokenBytes));
  }
  return token;
}

}  // namespace dlop::offload::protocol
