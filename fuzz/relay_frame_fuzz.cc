// Fuzz target: relay frames (transport/relay_frame.h, docs/protocol.md,
// "Frames") as a stream of bytes on one link. Beyond "no crash, no UB":
//   - ParseRelayHeader refuses only with kDataLoss and a message, and its
//     body limit is exactly `body_len <= max_body`;
//   - every frame accepted (header and crc) re-encodes byte for byte
//     (EncodeRelayHeader, EncodeRelayFrame): the format is canonical;
//   - a reader fed the stream in pieces, split at positions taken from the
//     input, reads the same frames and stops with the same error as one fed
//     the whole stream. The reader follows the relay store's read sequence
//     (header, key, body, crc, then the next frame; the first bad frame
//     closes the link) and, like it, allocates for a frame only after its
//     header passed.
//
// Input: a selector byte, a split count byte, then that many u16 split
// positions (taken modulo the stream size), then the stream.
//   selector bits 0-2  max_body: 0, 1, 16, 255, 4096, 1 MiB, 1 GiB, 2^64-1
//   selector bit 3     rewrite each frame's crc to the right value before
//                      reading, so mutations reach later frames
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/relay_frame.h"

namespace {

namespace ri = refit::internal;

void Check(bool ok) {
  if (!ok) std::abort();
}

constexpr uint64_t kMaxBodies[8] = {
    0, 1, 16, 255, 4096, uint64_t{1} << 20, uint64_t{1} << 30, ~uint64_t{0}};

struct Frame {
  ri::RelayFrameType type;
  std::string key;
  std::vector<uint8_t> body;
  bool operator==(const Frame&) const = default;
};

// What a link saw: the frames read, and how reading ended.
struct Outcome {
  std::vector<Frame> frames;
  bool failed = false;      // a bad frame closed the link
  std::string error;        // its message
  size_t pending = 0;       // bytes of a frame still incomplete at the end
  bool operator==(const Outcome&) const = default;
};

void CheckHeader(const uint8_t* in, uint64_t max_body) {
  auto h = ri::ParseRelayHeader(in, max_body);
  auto loose = ri::ParseRelayHeader(in, ~uint64_t{0});
  if (!h.ok()) {
    Check(h.status().code() == refit::StatusCode::kDataLoss);
    Check(!h.status().message().empty());
    // Only the body limit can separate the two.
    if (loose.ok()) Check(loose->body_len > max_body);
    return;
  }
  Check(loose.ok() && loose->body_len == h->body_len);
  Check(h->key_len <= ri::kRelayMaxKeyBytes && h->body_len <= max_body);
  uint8_t again[ri::kRelayHeaderBytes];
  ri::EncodeRelayHeader(h->type, h->key_len, h->body_len, again);
  Check(std::equal(again, again + ri::kRelayHeaderBytes, in));
}

// The incremental reader: Feed() takes bytes as they arrive.
class Reader {
 public:
  explicit Reader(uint64_t max_body) : max_body_(max_body) {}

  void Feed(std::span<const uint8_t> piece) {
    size_t i = 0;
    while (i < piece.size() && !out_.failed) {
      size_t want = Wanted();
      size_t take = std::min(want - got_, piece.size() - i);
      Take(piece.subspan(i, take));
      i += take;
      got_ += take;
      if (got_ == want) Step();
    }
  }

  Outcome Finish() {
    out_.pending = out_.failed ? 0 : Buffered();
    return out_;
  }

 private:
  enum class State { kHeader, kKey, kBody, kCrc };

  size_t Wanted() const {
    switch (state_) {
      case State::kHeader:
        return ri::kRelayHeaderBytes;
      case State::kKey:
        return hdr_.key_len;
      case State::kBody:
        return static_cast<size_t>(hdr_.body_len);
      case State::kCrc:
        return ri::kRelayTrailerBytes;
    }
    return 0;
  }

  size_t Buffered() const {
    switch (state_) {
      case State::kHeader:
        return got_;
      case State::kKey:
        return ri::kRelayHeaderBytes + got_;
      case State::kBody:
        return ri::kRelayHeaderBytes + key_.size() + got_;
      case State::kCrc:
        return ri::kRelayHeaderBytes + key_.size() + body_.size() + got_;
    }
    return 0;
  }

  void Take(std::span<const uint8_t> b) {
    switch (state_) {
      case State::kHeader:
        std::copy(b.begin(), b.end(), header_ + got_);
        break;
      case State::kKey:
        key_.append(b.begin(), b.end());
        break;
      case State::kBody:
        body_.insert(body_.end(), b.begin(), b.end());
        break;
      case State::kCrc:
        std::copy(b.begin(), b.end(), crc_ + got_);
        break;
    }
  }

  // A whole field is in: move to the next one (empty fields are skipped).
  void Step() {
    got_ = 0;
    switch (state_) {
      case State::kHeader: {
        auto h = ri::ParseRelayHeader(header_, max_body_);
        if (!h.ok()) return Fail(std::string(h.status().message()));
        hdr_ = *h;
        key_.clear();
        body_.clear();
        state_ = State::kKey;
        if (hdr_.key_len == 0) Step();
        return;
      }
      case State::kKey:
        state_ = State::kBody;
        if (hdr_.body_len == 0) Step();
        return;
      case State::kBody:
        state_ = State::kCrc;
        return;
      case State::kCrc: {
        if (ri::RelayFrameCrc(header_, key_, body_) != ri::LoadLe32(crc_)) {
          return Fail("crc mismatch");
        }
        out_.frames.push_back({hdr_.type, key_, body_});
        state_ = State::kHeader;
        return;
      }
    }
  }

  void Fail(std::string why) {
    out_.failed = true;
    out_.error = std::move(why);
  }

  const uint64_t max_body_;
  State state_ = State::kHeader;
  size_t got_ = 0;
  uint8_t header_[ri::kRelayHeaderBytes] = {};
  ri::RelayFrameHeader hdr_;
  std::string key_;
  std::vector<uint8_t> body_;
  uint8_t crc_[ri::kRelayTrailerBytes] = {};
  Outcome out_;
};

// Reads the whole stream at once, by offsets, re-encoding every frame it
// accepts. With `fix_crc`, first rewrites each frame's crc in `stream`.
Outcome ReadWhole(std::vector<uint8_t>& stream, uint64_t max_body, bool fix_crc) {
  Outcome out;
  size_t pos = 0;
  while (pos < stream.size()) {
    const size_t left = stream.size() - pos;
    if (left < ri::kRelayHeaderBytes) {
      out.pending = left;
      return out;
    }
    const uint8_t* hp = stream.data() + pos;
    CheckHeader(hp, max_body);
    auto h = ri::ParseRelayHeader(hp, max_body);
    if (!h.ok()) {
      out.failed = true;
      out.error = std::string(h.status().message());
      return out;
    }
    const uint64_t need = ri::kRelayHeaderBytes + uint64_t{h->key_len} +
                          h->body_len + ri::kRelayTrailerBytes;
    if (h->body_len > left || need > left) {
      out.pending = left;
      return out;
    }
    const size_t n = static_cast<size_t>(need);
    std::string_view key(reinterpret_cast<const char*>(hp) + ri::kRelayHeaderBytes,
                         h->key_len);
    std::span<const uint8_t> body(hp + ri::kRelayHeaderBytes + h->key_len,
                                  static_cast<size_t>(h->body_len));
    const uint32_t crc = ri::RelayFrameCrc(hp, key, body);
    uint8_t* crc_at = stream.data() + pos + n - ri::kRelayTrailerBytes;
    if (fix_crc) ri::StoreLe32(crc_at, crc);
    if (crc != ri::LoadLe32(crc_at)) {
      out.failed = true;
      out.error = "crc mismatch";
      return out;
    }
    const std::vector<uint8_t> again = ri::EncodeRelayFrame(h->type, key, body);
    Check(again.size() == n && std::equal(again.begin(), again.end(), hp));
    out.frames.push_back({h->type, std::string(key),
                          std::vector<uint8_t>(body.begin(), body.end())});
    pos += n;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint64_t max_body = kMaxBodies[data[0] & 7];
  const bool fix_crc = (data[0] >> 3) & 1;
  const size_t splits = data[1] & 7;
  size_t pos = 2;
  if (size - pos < 2 * splits) return 0;
  std::vector<uint16_t> cuts;
  for (size_t i = 0; i < splits; ++i, pos += 2) {
    cuts.push_back(static_cast<uint16_t>(data[pos] | data[pos + 1] << 8));
  }
  std::vector<uint8_t> stream(data + pos, data + size);

  const Outcome whole = ReadWhole(stream, max_body, fix_crc);

  std::vector<size_t> at;
  for (uint16_t c : cuts) at.push_back(stream.empty() ? 0 : c % (stream.size() + 1));
  at.push_back(0);
  at.push_back(stream.size());
  std::sort(at.begin(), at.end());
  Reader reader(max_body);
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    reader.Feed(std::span<const uint8_t>(stream).subspan(at[i], at[i + 1] - at[i]));
  }
  Check(reader.Finish() == whole);

  // The single-frame encoder agrees with the header encoder and crc.
  for (const Frame& f : whole.frames) {
    auto bytes = ri::EncodeRelayFrame(f.type, f.key, f.body);
    auto h = ri::ParseRelayHeader(bytes.data(), max_body);
    Check(h.ok() && h->type == f.type && h->key_len == f.key.size() &&
          h->body_len == f.body.size());
  }
  return 0;
}
