#include "sync_common.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "base/file.h"
#include "cli_util.h"
#include "flag_checks.h"
#include "refit/auth.h"
#include "refit/checkpoint.h"
#include "refit/store.h"
#include "sync/follow.h"
#include "sync/journal.h"
#include "sync/object_reader.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/relay_store.h"

namespace refit::cli {

// The shared HMAC key (--key-file), plus the publisher's Ed25519 signing
// key (--sign-key) or its public key (--verify-key).
Result<Authenticator> LoadAuth(const std::string& key_file,
                               const std::string& sign_key,
                               const std::string& verify_key) {
  Authenticator auth = Authenticator::None();
  if (!key_file.empty()) {
    REFIT_RETURN_IF_ERROR(CheckExists(key_file, "--key-file"));
    REFIT_ASSIGN_OR_RETURN(auth, Authenticator::FromKeyFile(key_file));
  }
  if (!sign_key.empty()) {
    REFIT_RETURN_IF_ERROR(CheckExists(sign_key, "--sign-key"));
    REFIT_ASSIGN_OR_RETURN(auth, auth.WithSigningKeyFile(sign_key));
  }
  if (!verify_key.empty()) {
    REFIT_RETURN_IF_ERROR(CheckExists(verify_key, "--verify-key"));
    REFIT_ASSIGN_OR_RETURN(auth, auth.WithVerifyKeyFile(verify_key));
  }
  return auth;
}

Result<uint64_t> ChunkBytes(double chunk_mib) {
  if (!(chunk_mib > 0) || chunk_mib > 1024 * 1024) {
    return InvalidArgumentError(
        fmt::format("--chunk-mib {} is out of range", chunk_mib));
  }
  return static_cast<uint64_t>(std::llround(chunk_mib * (1 << 20)));
}

// One compact JSON object per line (JSON Lines), flushed at once so a
// reader following the output (or a crash right after) sees whole lines.
void PrintJsonLine(const Json& j) {
  // One fwrite per line: the relay watcher thread prints lines too.
  std::string text =
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

std::string UtcNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace refit::cli
