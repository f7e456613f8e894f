#include "transport/relay_frame.h"

// The streaming state lives on the stack (no allocation per frame).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace refit::internal {
namespace {

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

void EncodeRelayHeader(RelayFrameType type, uint32_t key_len, uint64_t body_len,
                       uint8_t out[kRelayHeaderBytes]) {
  StoreLe32(out, kRelayMagic);
  out[4] = static_cast<uint8_t>(type);
  StoreLe32(out + 5, key_len);
  for (int i = 0; i < 8; ++i)
    out[9 + i] = static_cast<uint8_t>(body_len >> (8 * i));
}

Result<RelayFrameHeader> ParseRelayHeader(const uint8_t in[kRelayHeaderBytes],
                                          uint64_t max_body) {
  const uint32_t magic = LoadLe32(in);
  if (magic != kRelayMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", magic);
    if ((in[0] == 0x16 || in[0] == 0x15) && in[1] == 0x03) {
      // A TLS handshake or alert record where a frame should start.
      return DataLossError(std::string("bad relay frame magic 0x") + hex +
                           ": the peer sent a TLS record, it uses TLS and "
                           "this endpoint does not (relay TLS options)");
    }
    return DataLossError(std::string("bad relay frame magic 0x") + hex +
                         " (not a refit relay peer?)");
  }
  RelayFrameHeader h;
  const uint8_t type = in[4];
  if (type < static_cast<uint8_t>(RelayFrameType::kHello) ||
      type > static_cast<uint8_t>(RelayFrameType::kHeartbeat)) {
    return DataLossError("unknown relay frame type " + std::to_string(type));
  }
  h.type = static_cast<RelayFrameType>(type);
  h.key_len = LoadLe32(in + 5);
  h.body_len = LoadLe64(in + 9);
  if (h.key_len > kRelayMaxKeyBytes) {
    return DataLossError("relay frame key length " + std::to_string(h.key_len) +
                         " is over the limit of " +
                         std::to_string(kRelayMaxKeyBytes));
  }
  if (h.body_len > max_body) {
    return DataLossError("relay frame body length " +
                         std::to_string(h.body_len) + " is over the limit of " +
                         std::to_string(max_body) + " (max_body_bytes)");
  }
  return h;
}

uint32_t RelayFrameCrc(const uint8_t header[kRelayHeaderBytes],
                       std::string_view key, std::span<const uint8_t> body) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header + 4, kRelayHeaderBytes - 4);
  XXH3_64bits_update(&state, key.data(), key.size());
  XXH3_64bits_update(&state, body.data(), body.size());
  return static_cast<uint32_t>(XXH3_64bits_digest(&state));
}

std::vector<uint8_t> EncodeRelayFrame(RelayFrameType type, std::string_view key,
                                      std::span<const uint8_t> body) {
  std::vector<uint8_t> out(kRelayHeaderBytes + key.size() + body.size() +
                           kRelayTrailerBytes);
  EncodeRelayHeader(type, static_cast<uint32_t>(key.size()), body.size(),
                    out.data());
  std::copy(key.begin(), key.end(), out.begin() + kRelayHeaderBytes);
  std::copy(body.begin(), body.end(),
            out.begin() +
                static_cast<std::ptrdiff_t>(kRelayHeaderBytes + key.size()));
  StoreLe32(out.data() + out.size() - kRelayTrailerBytes,
            RelayFrameCrc(out.data(), key, body));
  return out;
}

}  // namespace refit::internal
