// Authentication of the offload control connection by a shared token.
//
// The daemon opens with CHALLENGE(server nonce, 32 random bytes). The client
// answers HELLO(client nonce, proof) with
//   proof = HMAC-SHA256(token, "dlop-offload hello" || server nonce || client nonce)
// which the daemon compares in constant time; a wrong proof closes the
// connection. Each side then derives one key per direction,
//   key(c2s) = HMAC-SHA256(token, "dlop-offload c2s" || server nonce || client nonce)
//   key(s2c) = likewise with "dlop-offload s2c",
// and every later frame carries an HMAC under its direction's key (see
// protocol.hpp). So only a holder of the token can send an accepted frame, a
// frame recorded on one connection fails the MAC on any other (fresh nonces),
// and within one connection the sequence number refuses replays. The WELCOME
// is the daemon's first keyed frame: a client that verifies it knows the
// daemon holds the token too. Nothing is encrypted: batches and specs are
// not secret, their integrity and origin are what matter.
#pragma once

#include <filesystem>
#include <string>

#include "offload/protocol.hpp"
#include "offload/protocol_messages.hpp"

namespace dlop::offload::protocol {

// Tokens shorter than this are refused: the token is the only secret.
inline constexpr std::size_t kMinTokenBytes = 16;

Nonce random_nonce();  // OpenSSL's RAND_bytes; throws kSystem if it has no entropy
Digest hello_proof(std::string_view token, const Nonce& server, const Nonce& client);
bool proof_matches(const Digest& a, const Digest& b);  // constant time

struct SessionKeys {
  Key client_to_server{};
  Key server_to_client{};
};
SessionKeys session_keys(std::string_view token, const Nonce& server, const Nonce& client);

// Reads a token file: its contents without trailing whitespace. Throws
// dlop::Error(kInvalidArgument) naming the file when it cannot be read, is
// shorter than kMinTokenBytes, or (with `strict`) when group or others may
// read or write it, as ssh does with keys: the daemon is strict, clients
// only warn.
std::string read_token_file(const std::filesystem::path& path, bool strict);

}  // namespace dlop::offload::protocol
