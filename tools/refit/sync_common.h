// What the distribution commands (publish, receive, status, keygen)
// share: keys from their flags, the chunk size, JSON Lines output and
// timestamps. Not thread-safe unless said otherwise.
#ifndef REFIT_TOOLS_REFIT_SYNC_COMMON_H_
#define REFIT_TOOLS_REFIT_SYNC_COMMON_H_

#include <cstdint>
#include <string>

#include "cli_util.h"
#include "refit/auth.h"
#include "refit/status.h"

namespace refit::cli {

// The shared HMAC key (--key-file), plus the publisher's Ed25519 signing
// key (--sign-key) or its public key (--verify-key); "" leaves one out.
Result<Authenticator> LoadAuth(const std::string& key_file,
                               const std::string& sign_key = "",
                               const std::string& verify_key = "");

// --chunk-mib in bytes; kInvalidArgument when out of range.
Result<uint64_t> ChunkBytes(double chunk_mib);

// One compact JSON object per line (JSON Lines), flushed at once so a
// reader following the output (or a crash right after) sees whole lines.
// Thread-safe: one write per line.
void PrintJsonLine(const Json& j);

// Now, as "YYYY-MM-DDTHH:MM:SSZ".
std::string UtcNow();

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_SYNC_COMMON_H_
