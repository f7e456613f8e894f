#include "ranks/parts.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/bytes.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/parallel.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "format/json.h"
#include "sync/chunk_pack.h"
#include "sync/protocol.h"
#include "sync/resend.h"
#include "sync/supersede.h"
#include "sync/votes.h"
#include "transport/once_uploader.h"

namespace refit::ranks {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kPartMagic[8] = {'R', 'F', 'P', 'A', 'R', 'T', '0', '2'};
// Format 3: every entry also carries its offset in a chunk pack.
constexpr char kPartMagic3[8] = {'R', 'F', 'P', 'A', 'R', 'T', '0', '3'};
constexpr uint64_t kMaxPartChunks = uint64_t{1} << 24;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Parts are written once; a rank re-running its part writes the same bytes.
constexpr char kPartConflict[] =
    "this version's part was started from other tensors or another baseline; publish a "
    "higher version";

}  // namespace

uint64_t HashTensorNames(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  std::string all;
  for (const auto& n : names) {
    all += n;
    all.push_back('\0');
  }
  return XXH3_64bits(all.data(), all.size());
}

std::vector<uint8_t> EncodePartList(const PartList& l) {
  // Lists without a packed chunk keep format 2, which coordinators that
  // predate packs read.
  bool v3 = false;
  for (const PartEntry& e : l.chunks) v3 = v3 || e.pack_offset != 0;
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(reinterpret_cast<const uint8_t*>(v3 ? kPartMagic3 : kPartMagic), 8);
  w.U64(l.version);
  w.U64(l.base_version);
  w.U32(l.rank);
  w.U64(l.tensor_count);
  w.U64(l.names_hash);
  w.Varint(l.chunks.size());
  for (const PartEntry& e : l.chunks) {
    w.Varint(e.size);
    w.Bytes(e.sha256.data(), e.sha256.size());
    w.Varint(e.tensor_id);
    w.Varint(e.start);
    w.Varint(e.count);
    w.Varint(e.run);
    w.Varint(e.run != 0 ? e.stride : 0);
    w.Varint(e.changed);
    w.U8(e.kind);
    if (v3) w.Varint(e.pack_offset);
  }
  w.U64(XXH3_64bits(out.data(), out.size()));
  return out;
}

Result<PartList> DecodePartList(std::span<const uint8_t> body) {
  if (body.size() < 8 + 8 || (std::memcmp(body.data(), kPartMagic, 8) != 0 &&
                              std::memcmp(body.data(), kPartMagic3, 8) != 0)) {
    return DataLossError("not a part list (bad magic)");
  }
  const bool v3 = std::memcmp(body.data(), kPartMagic3, 8) == 0;
  const size_t covered = body.size() - 8;
  ByteReader tail(body.subspan(covered));
  if (tail.U64() != XXH3_64bits(body.data(), covered)) {
    return DataLossError("part list checksum mismatch");
  }
  ByteReader r(body.subspan(8, covered - 8));
  PartList l;
  l.version = r.U64();
  l.base_version = r.U64();
  l.rank = r.U32();
  l.tensor_count = r.U64();
  l.names_hash = r.U64();
  uint64_t n = r.Varint();
  REFIT_RETURN_IF_ERROR(r.status("part list"));
  if (n > kMaxPartChunks || n > r.remaining() / 40) {
    return DataLossError("part list names " + std::to_string(n) + " chunks");
  }
  for (uint64_t i = 0; i < n; ++i) {
    PartEntry e;
    e.size = r.Varint();
    auto sha = r.Bytes(32);
    e.tensor_id = r.Varint();
    e.start = r.Varint();
    e.count = r.Varint();
    e.run = r.Varint();
    e.stride = r.Varint();
    e.changed = r.Varint();
    e.kind = r.U8();
    if (v3) e.pack_offset = r.Varint();
    REFIT_RETURN_IF_ERROR(r.status("part list"));
    std::copy(sha.begin(), sha.end(), e.sha256.begin());
    // The region's form (docs/format.md §3); bounds are the reader's to
    // check against its tensor table.
    const bool form = e.count > 0 && e.count <= kMaxChunkElements && e.kind >= 1 &&
                      e.kind <= 4 &&
                      (e.run == 0 ? e.stride == 0
                                  : e.run < e.count && e.count % e.run == 0 &&
                                        e.stride > e.run &&
                                        e.count / e.run - 1 <= (uint64_t{1} << 62) / e.stride);
    // A packed chunk follows the previous chunk of its pack (packs are runs
    // of consecutive part chunks at the first one's key).
    const bool packed = e.pack_offset == 0 || (e.pack_offset < kMaxPackChunks && i > 0 &&
                                               l.chunks.back().pack_offset == e.pack_offset - 1);
    if (!form || !packed) {
      return DataLossError("part list entry " + std::to_string(i) + " is malformed");
    }
    l.chunks.push_back(e);
  }
  if (r.remaining() != 0) return DataLossError("part list has trailing bytes");
  if (l.version <= l.base_version) return DataLossError("part list version <= its base");
  return l;
}

// ---------------------------------------------------------------------------
// RankPublisher

Result<std::unique_ptr<RankPublisher>> RankPublisher::Open(ObjectStore* parts,
                                                           ObjectStore* store,
                                                           trainer::RankEncoderInterface* encoder,
                                                           uint32_t rank, uint64_t committed,
                                                           RankPublisherOptions options) {
  if (parts == nullptr || store == nullptr || encoder == nullptr) {
    return InvalidArgumentError("RankPublisher needs a parts store, a store and an encoder");
  }
  std::unique_ptr<RankPublisher> p(new RankPublisher());
  p->parts_ = parts;
  p->store_ = store;
  p->encoder_ = encoder;
  p->rank_ = rank;
  p->committed_ = committed;
  p->opt_ = std::move(options);
  std::vector<std::string> names;
  for (const auto& c : encoder->canonical_tensors()) names.push_back(c.name);
  p->names_hash_ = HashTensorNames(std::move(names));
  return p;
}

Result<RankPartReport> RankPublisher::Publish(uint64_t version,
                                              const std::vector<TensorView>& local,
                                              const trainer::GlobalAmax& amax) {
  if (pending_ != 0) {
    return FailedPreconditionError("rank " + std::to_string(rank_) + " published version " +
                                   std::to_string(pending_) +
                                   " and has not seen its decision; AwaitDecision first");
  }
  if (version <= committed_) {
    return InvalidArgumentError("version " + std::to_string(version) +
                                " is not above the committed version " +
                                std::to_string(committed_));
  }
  auto t0 = Clock::now();
  RankPartReport report;
  report.version = version;
  report.base_version = committed_;
  PartList list;
  list.version = version;
  list.base_version = committed_;
  list.rank = rank_;
  list.tensor_count = encoder_->canonical_tensors().size();
  list.names_hash = names_hash_;
  OnceUploader up(parts_, opt_.upload_threads, kPartConflict);
  // Chunk packs (docs/protocol.md, "Chunk packs"): sealed chunks smaller
  // than pack_bytes gathered, from part chunk pack_first on, and stored at
  // its key; one chunk gathered is stored as itself.
  std::vector<std::vector<uint8_t>> pack;
  uint64_t pack_first = 0, pack_size = 0;
  auto flush_pack = [&]() -> Status {
    if (pack.empty()) return Status();
    std::vector<uint8_t> object = pack.size() == 1 ? std::move(pack.front()) : EncodePack(pack);
    pack.clear();
    pack_size = 0;
    return up.Add(PartChunkKey(version, rank_, pack_first), std::move(object));
  };
  auto encoded = encoder_->Encode(
      version, committed_, local, [&](std::span<const uint8_t> chunk, const ChunkHeader& h) {
        std::vector<uint8_t> sealed = opt_.auth.Seal(chunk);
        PartEntry e;
        e.size = sealed.size();
        e.sha256 = ComputeSha256(sealed);
        e.tensor_id = h.tensor_id;
        e.start = h.start;
        e.count = h.count;
        e.run = h.run;
        e.stride = h.stride;
        e.changed = h.changed;
        e.kind = static_cast<uint8_t>(h.kind);
        const uint64_t k = list.chunks.size();
        if (sealed.size() < opt_.pack_bytes) {
          if (!pack.empty() &&
              (pack_size + sealed.size() > opt_.pack_bytes || pack.size() >= kMaxPackChunks)) {
            REFIT_RETURN_IF_ERROR(flush_pack());
          }
          if (pack.empty()) pack_first = k;
          e.pack_offset = pack.size();
          list.chunks.push_back(e);
          pack_size += sealed.size();
          pack.push_back(std::move(sealed));
          return Status();
        }
        list.chunks.push_back(e);
        REFIT_RETURN_IF_ERROR(flush_pack());
        return up.Add(PartChunkKey(version, rank_, k), std::move(sealed));
      },
      amax);
  Status finished = encoded.ok() ? flush_pack() : Status();
  Status uploaded = up.Finish();
  if (finished.ok()) finished = uploaded;
  if (!encoded.ok()) {
    encoder_->Abort();
    return encoded.status();
  }
  if (!finished.ok()) {
    encoder_->Abort();
    return finished;
  }
  std::vector<uint8_t> sealed_list = opt_.auth.Seal(EncodePartList(list));
  Status st = PutOnce(parts_, PartListKey(version, rank_), sealed_list, kPartConflict);
  if (!st.ok()) {
    encoder_->Abort();
    return st;
  }
  report.encode = *encoded;
  report.bytes_uploaded = up.bytes() + sealed_list.size();
  report.seconds = Since(t0);
  pending_ = version;
  return report;
}

Result<bool> RankPublisher::AwaitDecision(int timeout_ms) {
  if (pending_ == 0) return FailedPreconditionError("no version is waiting for a decision");
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto got = store_->Get(DecisionKey(pending_));
    if (got.ok()) {
      REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> body, opt_.auth.Open(*got));
      REFIT_ASSIGN_OR_RETURN(Decision d, DecodeDecision(body));
      if (d.version != pending_) {
        return DataLossError("the decision under version " + std::to_string(pending_) +
                             "'s key names version " + std::to_string(d.version));
      }
      if (d.commit) {
        REFIT_RETURN_IF_ERROR(encoder_->Commit());
        committed_ = pending_;
      } else {
        encoder_->Abort();
      }
      pending_ = 0;
      own_chunks_.reset();
      served_requests_.clear();
      return d.commit;
    }
    if (got.status().code() != StatusCode::kNotFound) return got.status();
    if (Clock::now() >= deadline) {
      return DeadlineExceededError("no decision for version " + std::to_string(pending_) +
                                   " within " + std::to_string(timeout_ms) + " ms");
    }
    const uint64_t since = store_->ChangeCount();
    REFIT_RETURN_IF_ERROR(ServeResends());
    store_->AwaitChange(since, opt_.poll_ms);
  }
}

Status RankPublisher::ServeResends() {
  if (!own_chunks_) {
    // Requests name manifest indices: map them to this rank's part once
    // the manifest is stored (receivers ask only after reading it).
    auto got = store_->Get(ManifestKey(pending_));
    if (!got.ok()) {
      return got.status().code() == StatusCode::kNotFound ? Status() : got.status();
    }
    own_chunks_.emplace();
    // A manifest that fails its checks names nothing this rank can serve
    // (receivers refuse it too, and the version aborts); a version
    // assembled by a coordinator is served by its publisher.
    auto body = opt_.auth.Open(*got);
    if (!body.ok()) return Status();
    auto decoded = DecodeManifest(*body);
    if (!decoded.ok()) return Status();
    const Manifest& m = *decoded;
    if (!m.direct || m.version != pending_) return Status();
    for (size_t i = 0; i < m.chunks.size(); ++i) {
      const ManifestChunk& c = m.chunks[i];
      if (c.in_part && c.rank == rank_) (*own_chunks_)[i] = c.part_index;
    }
  }
  if (own_chunks_->empty()) return Status();
  return refit::ServeResends(
      store_, opt_.auth, pending_, &served_requests_,
      [&](uint64_t i, bool after) -> Result<std::optional<std::vector<uint8_t>>> {
        using Served = std::optional<std::vector<uint8_t>>;
        auto own = own_chunks_->find(i);
        if (own == own_chunks_->end() || own->second >= encoder_->pending_chunks()) {
          return Served();  // another rank's chunk
        }
        REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> chunk,
                               encoder_->PendingChunk(own->second));
        REFIT_ASSIGN_OR_RETURN(ParsedChunk original, ParseChunk(chunk));
        REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> desired,
                               encoder_->PendingRegion(own->second, after));
        REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> resend,
                               MakeResend(original, desired.data(), after));
        return Served(std::move(resend));
      },
      &resends_served_);
}

// ---------------------------------------------------------------------------
// PartsCoordinator

namespace {

std::vector<Hash128> TensorHashes(const Checkpoint& ck) {
  std::vector<Hash128> out;
  for (size_t i = 0; i < ck.tensors().size(); ++i) {
    auto d = ck.Data(i);
    out.push_back(RangeHash(d.data(), d.size()));
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<PartsCoordinator>> PartsCoordinator::Open(
    ObjectStore* parts, Publisher* publisher, const std::string& baseline_path,
    const std::string& staging_path, CoordinatorOptions options) {
  if (parts == nullptr || publisher == nullptr) {
    return InvalidArgumentError("PartsCoordinator needs a parts store and a publisher");
  }
  if (options.ranks.empty()) return InvalidArgumentError("the coordinator needs the ranks");
  REFIT_ASSIGN_OR_RETURN(Checkpoint base, Checkpoint::Open(baseline_path, Checkpoint::Mode::kReadOnly));
  bool fresh = true;
  {
    auto staging = Checkpoint::Open(staging_path, Checkpoint::Mode::kReadOnly);
    if (staging.ok()) {
      bool same = staging->tensors().size() == base.tensors().size();
      for (size_t i = 0; same && i < base.tensors().size(); ++i) {
        same = staging->tensors()[i].name == base.tensors()[i].name &&
               staging->tensors()[i].shape == base.tensors()[i].shape &&
               staging->tensors()[i].dtype == base.tensors()[i].dtype;
      }
      // A staging copy left by an interrupted version is replaced.
      fresh = !(same && TensorHashes(*staging) == TensorHashes(base));
    }
  }
  if (fresh) REFIT_RETURN_IF_ERROR(CopyCheckpoint(baseline_path, staging_path));
  std::unique_ptr<PartsCoordinator> c(new PartsCoordinator());
  c->parts_ = parts;
  c->publisher_ = publisher;
  REFIT_ASSIGN_OR_RETURN(Checkpoint staging,
                         Checkpoint::Open(staging_path, Checkpoint::Mode::kReadWrite));
  c->staging_ = std::make_unique<Checkpoint>(std::move(staging));
  c->opt_ = std::move(options);
  std::vector<std::string> names;
  for (const TensorInfo& t : c->staging_->tensors()) names.push_back(t.name);
  c->names_hash_ = HashTensorNames(names);
  return c;
}

Result<CoordinatedReport> PartsCoordinator::Publish(uint64_t version) {
  CoordinatedReport report;
  const uint64_t base = publisher_->committed_version();
  if (version <= base) {
    return InvalidArgumentError("version " + std::to_string(version) +
                                " is not above the committed version " + std::to_string(base));
  }
  // 1. Every rank's part list, up to the deadline.
  auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(opt_.parts_timeout_ms);
  std::vector<PartList> lists(opt_.ranks.size());
  std::vector<bool> have(opt_.ranks.size(), false);
  size_t missing = opt_.ranks.size();
  while (missing > 0) {
    for (size_t i = 0; i < opt_.ranks.size(); ++i) {
      if (have[i]) continue;
      const uint32_t rank = opt_.ranks[i];
      auto got = parts_->Get(PartListKey(version, rank));
      if (!got.ok()) {
        if (got.status().code() == StatusCode::kNotFound) continue;
        return got.status();
      }
      REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> body, opt_.auth.Open(*got));
      REFIT_ASSIGN_OR_RETURN(PartList l, DecodePartList(body));
      const std::string who = "rank " + std::to_string(rank) + "'s part of version " +
                              std::to_string(version);
      if (l.version != version || l.rank != rank) {
        return DataLossError(who + " names version " + std::to_string(l.version) +
                             ", rank " + std::to_string(l.rank));
      }
      if (l.base_version != base) {
        return FailedPreconditionError(who + " was encoded against version " +
                                       std::to_string(l.base_version) +
                                       "; the committed version is " + std::to_string(base));
      }
      if (l.tensor_count != staging_->tensors().size() || l.names_hash != names_hash_) {
        return FailedPreconditionError(who + " indexes another set of canonical tensors "
                                       "than the checkpoint's (layout and checkpoint differ)");
      }
      lists[i] = std::move(l);
      have[i] = true;
      --missing;
    }
    if (missing == 0) break;
    if (Clock::now() >= deadline) {
      std::string names;
      for (size_t i = 0; i < opt_.ranks.size(); ++i) {
        if (!have[i]) names += (names.empty() ? "" : ", ") + std::to_string(opt_.ranks[i]);
      }
      return DeadlineExceededError("version " + std::to_string(version) + ": no part from rank(s) " +
                                   names + " within " + std::to_string(opt_.parts_timeout_ms) +
                                   " ms; nothing was published");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
  }
  report.wait_seconds = Since(t0);

  // 2. Check and apply every chunk to staging, at most once each.
  auto t1 = Clock::now();
  struct Applied {
    std::vector<uint8_t> chunk;
    size_t tensor;
    UndoRecord undo;
  };
  std::vector<Applied> applied;
  ApplyScratch scratch;
  auto roll_back = [&] {
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
      auto parsed = ParseChunk(it->chunk);
      if (parsed.ok()) {
        (void)UndoChunkInPlace(*parsed, staging_->MutableData(it->tensor).data(), &scratch,
                               it->undo);
      }
    }
    applied.clear();
  };
  Status st;
  // The pack last fetched: a rank's part is read in its order, so each of
  // its packs is fetched once.
  std::string pack_key;
  std::vector<uint8_t> pack;
  std::vector<std::span<const uint8_t>> elements;
  for (size_t i = 0; i < lists.size() && st.ok(); ++i) {
    const uint32_t rank = opt_.ranks[i];
    for (size_t k = 0; k < lists[i].chunks.size() && st.ok(); ++k) {
      const PartEntry& e = lists[i].chunks[k];
      const std::string key = PartChunkKey(version, rank, k - e.pack_offset);
      auto run = [&]() -> Status {
        std::vector<uint8_t> sealed;
        if (key != pack_key) {
          REFIT_ASSIGN_OR_RETURN(sealed, parts_->Get(key));
          if (IsPack(sealed)) {
            pack_key.clear();
            pack = std::move(sealed);
            auto decoded = DecodePack(pack);
            if (!decoded.ok()) return decoded.status().WithContext("'" + key + "'");
            elements = std::move(*decoded);
            pack_key = key;
          } else if (e.pack_offset != 0) {
            return DataLossError("'" + key + "' is not the pack its part list names");
          }
        }
        if (key == pack_key) {
          if (e.pack_offset >= elements.size()) {
            return DataLossError("'" + key + "' holds " + std::to_string(elements.size()) +
                                 " chunks; its part list places chunk " + std::to_string(k) +
                                 " at " + std::to_string(e.pack_offset));
          }
          sealed.assign(elements[e.pack_offset].begin(), elements[e.pack_offset].end());
        }
        if (sealed.size() != e.size || ComputeSha256(sealed) != e.sha256) {
          return DataLossError("'" + key + "' is not the object its part list names");
        }
        REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> body, opt_.auth.Open(sealed));
        REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
        const ChunkHeader& h = c.header;
        if (c.size != body.size() || h.version != version || h.base_version != base ||
            h.tensor_id >= staging_->tensors().size()) {
          return DataLossError("'" + key + "' does not belong to version " +
                               std::to_string(version) + " on base " + std::to_string(base));
        }
        const TensorInfo& t = staging_->tensors()[h.tensor_id];
        if (h.width != t.element_width || h.End() > t.num_elements) {
          return DataLossError("'" + key + "' does not fit tensor '" + t.name + "'");
        }
        uint8_t* data = staging_->MutableData(h.tensor_id).data();
        switch (ClassifyRange(h, RegionHash(h, data))) {
          case RangeState::kAfter:
            return Status();  // applied by an earlier attempt
          case RangeState::kNeither:
            return FailedPreconditionError(
                "'" + key + "' does not apply to the staging copy of tensor '" + t.name +
                "' (its region hashes to neither its base nor its target: regions of two "
                "ranks overlap, or the rank's baseline is not the committed version)");
          case RangeState::kBefore:
            break;
        }
        Applied a;
        a.tensor = h.tensor_id;
        REFIT_RETURN_IF_ERROR(ApplyChunkInPlace(c, data, &scratch, nullptr, &a.undo));
        report.changed_elements += h.changed;
        ++report.part_chunks;
        report.part_bytes += sealed.size();
        a.chunk.assign(body.begin(), body.end());
        applied.push_back(std::move(a));
        return Status();
      };
      st = run();
    }
  }
  report.apply_seconds = Since(t1);
  if (!st.ok()) {
    roll_back();
    return st;
  }

  // 3. The joint commit of the assembled version.
  auto published = publisher_->Publish(version, CheckpointViews(*staging_));
  if (!published.ok()) {
    roll_back();
    return published.status().WithContext("publishing the assembled version");
  }
  if (!published->committed) roll_back();
  report.publish = std::move(*published);
  return report;
}

}  // namespace refit::ranks

// ---------------------------------------------------------------------------
// DirectCoordinator

namespace refit::ranks {
namespace {

Result<std::optional<std::vector<uint8_t>>> GetIfStored(ObjectStore* store,
                                                        const std::string& key) {
  auto got = store->Get(key);
  if (got.ok()) return std::optional<std::vector<uint8_t>>(std::move(*got));
  if (got.status().code() == StatusCode::kNotFound) {
    return std::optional<std::vector<uint8_t>>();
  }
  return got.status();
}

// The tensor table of a checkpoint's tensors, each with its hash (before
// and after alike), sorted by name.
std::vector<TensorEntry> TableOf(const std::vector<TensorInfo>& tensors,
                                 const std::vector<Hash128>& hashes) {
  std::vector<TensorEntry> out;
  out.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    TensorEntry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.width = static_cast<uint8_t>(t.element_width);
    e.shape = t.shape;
    e.num_elements = t.num_elements;
    e.before = e.after = hashes[i];
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  return out;
}

}  // namespace

std::vector<TensorEntry> TensorTableOf(const Checkpoint& ck) {
  std::vector<Hash128> hashes;
  for (size_t i = 0; i < ck.tensors().size(); ++i) {
    auto d = ck.Data(i);
    hashes.push_back(RangeHash(d.data(), d.size()));
  }
  return TableOf(ck.tensors(), hashes);
}

Result<std::vector<TensorEntry>> ReadTensorTable(const Checkpoint& ck,
                                                 const TableReadOptions& options) {
  const std::vector<TensorInfo>& tensors = ck.tensors();
  const uint64_t segment = kRangeHashSegment;
  const uint64_t buffer =
      std::max<uint64_t>(segment, (options.buffer_bytes + segment - 1) / segment * segment);
  const int threads = options.threads > 0 ? options.threads : std::min(4, DefaultThreads());

  auto context = [&](const TensorInfo& t) {
    return "tensor " + internal::QuoteForMessage(t.name) + " in '" +
           ck.files()[t.file_index].path + "'";
  };
  // A file holding no tensor is not opened.
  std::vector<ReadOnlyFile> files(ck.files().size());
  for (const TensorInfo& t : tensors) {
    ReadOnlyFile& file = files[t.file_index];
    if (!file.path().empty()) continue;
    Result<ReadOnlyFile> opened = ReadOnlyFile::Open(ck.files()[t.file_index].path);
    if (!opened.ok()) return opened.status().WithContext(context(t));
    file = std::move(opened).value();
    file.AdviseSequential(0, file.size());
  }

  // Work items are whole buffers of one tensor, taken in tensor order. A
  // tensor's digests (16 bytes per 64 KiB) live from its first item taken
  // until its last item done, when its hash is made and they are freed, so
  // at most threads + 1 tensors hold digests at once.
  struct Item {
    size_t tensor;
    uint64_t offset;  // into the tensor
  };
  std::vector<Item> items;
  std::vector<std::atomic<uint64_t>> left(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    uint64_t n = 0;
    uint64_t off = 0;
    do {
      items.push_back({t, off});
      ++n;
      off += buffer;
    } while (off < tensors[t].byte_size);
    left[t].store(n, std::memory_order_relaxed);
  }
  std::vector<std::vector<Hash128>> digests(tensors.size());
  std::vector<std::once_flag> allocated(tensors.size());
  std::vector<Hash128> hashes(tensors.size());

  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(threads));
  std::mutex mu;
  Status first_error;
  std::atomic<bool> failed{false};
  ParallelForEach(items.size(), threads, [&](size_t i, int worker) {
    if (failed.load(std::memory_order_relaxed)) return;
    const Item& item = items[i];
    const TensorInfo& t = tensors[item.tensor];
    std::call_once(allocated[item.tensor],
                   [&] { digests[item.tensor].resize(SegmentCount(t.byte_size)); });
    std::vector<uint8_t>& buf = buffers[static_cast<size_t>(worker)];
    if (buf.empty()) buf.resize(static_cast<size_t>(buffer));
    const uint64_t n = std::min(buffer, t.byte_size - item.offset);
    Status s = files[t.file_index].ReadAt(t.offset + item.offset, {buf.data(), n});
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = s.WithContext(context(t));
      failed.store(true, std::memory_order_relaxed);
      return;
    }
    // Every item but a tensor's last is a whole number of segments, so
    // the segments here are the tensor's own.
    SegmentDigests(buf.data(), n, digests[item.tensor].data() + item.offset / segment);
    if (left[item.tensor].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::vector<Hash128>& d = digests[item.tensor];
      hashes[item.tensor] = HashSegmentDigests(d.data(), d.size());
      std::vector<Hash128>().swap(d);
    }
  });
  if (!first_error.ok()) return first_error;

  return TableOf(tensors, hashes);
}

Result<std::unique_ptr<DirectCoordinator>> DirectCoordinator::Open(
    ObjectStore* store, DirectCoordinatorOptions options) {
  if (store == nullptr) return InvalidArgumentError("DirectCoordinator needs a store");
  if (options.ranks.empty()) return InvalidArgumentError("the coordinator needs the ranks");
  if (options.members.empty()) return InvalidArgumentError("the coordinator needs the members");
  for (const std::string& m : options.members) REFIT_RETURN_IF_ERROR(ValidateMember(m));
  std::sort(options.initial.begin(), options.initial.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  std::unique_ptr<DirectCoordinator> c(new DirectCoordinator());
  c->store_ = store;
  c->opt_ = std::move(options);
  REFIT_ASSIGN_OR_RETURN(auto head, GetIfStored(store, kHeadKey));
  if (head) {
    REFIT_ASSIGN_OR_RETURN(auto body, c->opt_.auth.Open(*head));
    REFIT_ASSIGN_OR_RETURN(c->committed_, DecodeHead(body));
  }
  return c;
}

Result<std::vector<TensorEntry>> DirectCoordinator::TableOf(uint64_t v) {
  REFIT_ASSIGN_OR_RETURN(auto manifest, GetIfStored(store_, ManifestKey(v)));
  if (manifest) {
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*manifest));
    REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(body));
    if (m.direct) {
      REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(DecisionKey(v)));
      REFIT_ASSIGN_OR_RETURN(auto dbody, opt_.auth.Open(bytes));
      REFIT_ASSIGN_OR_RETURN(Decision d, DecodeDecision(dbody));
      if (!d.commit || d.tensors.size() != m.tensors.size()) {
        return DataLossError("head names version " + std::to_string(v) +
                             ", whose decision records no tensor hashes");
      }
      for (size_t t = 0; t < m.tensors.size(); ++t) m.tensors[t].after = d.tensors[t];
    }
    // Version v's hashes are the base of the next version.
    for (TensorEntry& e : m.tensors) e.before = e.after;
    return std::move(m.tensors);
  }
  REFIT_ASSIGN_OR_RETURN(auto snap, GetIfStored(store_, SnapshotIndexKey(v)));
  if (snap) {
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*snap));
    REFIT_ASSIGN_OR_RETURN(SnapshotIndex s, DecodeSnapshotIndex(body));
    return std::move(s.tensors);
  }
  if (opt_.initial.empty()) {
    return FailedPreconditionError("the store records no tensor table for version " +
                                   std::to_string(v) +
                                   " (no manifest, no snapshot); give the coordinator the "
                                   "table of that version (TensorTableOf)");
  }
  return opt_.initial;
}

Status DirectCoordinator::AbortSuperseded(uint64_t version) {
  return refit::AbortSuperseded(store_, opt_.auth, committed_, version, "coordinator");
}

Result<std::vector<uint32_t>> DirectCoordinator::PartsStored(uint64_t version) {
  std::vector<uint32_t> out;
  for (uint32_t rank : opt_.ranks) {
    REFIT_ASSIGN_OR_RETURN(auto got, GetIfStored(store_, PartListKey(version, rank)));
    if (got) out.push_back(rank);
  }
  return out;
}

// Votes until every member voted, one voted failed, or the deadline; then
// the one decision (docs/protocol.md, "Versions from many ranks").
Result<Decision> DirectCoordinator::VoteAndDecide(const Manifest& m, std::vector<bool> touched,
                                                  DirectReport* report) {
  const uint64_t version = m.version;
  REFIT_ASSIGN_OR_RETURN(CollectedVotes collected,
                         CollectVotes(store_, opt_.auth, version, opt_.members,
                                      VoteWait{opt_.vote_timeout_ms, opt_.poll_ms}));
  const std::map<std::string, Vote>& votes = collected.votes;
  report->vote_seconds = collected.seconds;
  Decision d;
  d.version = version;
  std::string why;
  const std::vector<Hash128>* agreed = nullptr;
  for (const std::string& member : opt_.members) {
    auto it = votes.find(member);
    if (it == votes.end()) {
      if (why.empty()) why = "no vote from '" + member + "' by the deadline";
      continue;
    }
    const Vote& v = it->second;
    if (!v.ready) {
      why = "member failed: " + member + ": " + v.message;
      break;
    }
    if (v.tensors.size() != m.tensors.size()) {
      if (why.empty()) why = "'" + member + "' voted ready without the tensors' hashes";
      continue;
    }
    for (size_t t = 0; t < m.tensors.size() && why.empty(); ++t) {
      // A tensor without chunks is the base's; one with chunks must hash
      // alike on every member.
      if (!touched[t] && v.tensors[t] != m.tensors[t].before) {
        why = "'" + member + "' holds tensor '" + m.tensors[t].name +
              "' off its base after the version";
      } else if (agreed != nullptr && v.tensors[t] != (*agreed)[t]) {
        why = "members disagree on tensor '" + m.tensors[t].name +
              "' after the version (first: '" + member + "')";
      }
    }
    if (agreed == nullptr) agreed = &v.tensors;
  }
  if (why.empty() && agreed != nullptr) {
    d.commit = true;
    d.tensors = *agreed;
  } else {
    d.commit = false;
    d.reason = why.empty() ? "no vote" : why;
  }
  return WriteDecision(store_, opt_.auth, d);
}

Result<DirectReport> DirectCoordinator::Publish(uint64_t version) {
  auto t0 = Clock::now();
  DirectReport report;
  report.version = version;
  report.base_version = committed_;
  const uint64_t base = committed_;
  if (version <= base) {
    return InvalidArgumentError("version " + std::to_string(version) +
                                " is not above the committed version " + std::to_string(base));
  }
  const std::string V = std::to_string(version);
  // A decision from an earlier run is final.
  REFIT_ASSIGN_OR_RETURN(auto decided, GetIfStored(store_, DecisionKey(version)));
  std::optional<Decision> decision;
  if (decided) {
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*decided));
    REFIT_ASSIGN_OR_RETURN(decision, DecodeDecision(body));
  } else {
    // 1. The announcement, as soon as the first rank has stored anything
    // of its part: receivers then read the ranks' chunks as they are
    // stored (docs/protocol.md, "Versions from many ranks"), long before
    // the manifest can list them, and wait no longer than an upload lasts.
    // 2. Every rank's part list, up to the deadline. Without all of them
    // nothing more is written: no manifest, no decision (a later Publish
    // of the version, or a higher version, goes on from there).
    REFIT_ASSIGN_OR_RETURN(std::vector<TensorEntry> table, TableOf(base));
    constexpr char kConflict[] =
        "this version was announced with other parts or members; publish a higher version";
    bool announced = false;
    auto announce = [&]() -> Status {
      REFIT_RETURN_IF_ERROR(AbortSuperseded(version));
      Announcement a;
      a.version = version;
      a.base_version = base;
      a.members = opt_.members;
      a.tensors = table;
      for (TensorEntry& t : a.tensors) t.after = Hash128{};
      REFIT_RETURN_IF_ERROR(
          PutOnce(store_, IndexKey(version), opt_.auth.Seal(EncodeAnnouncement(a)), kConflict));
      announced = true;
      return Status();
    };
    std::vector<std::string> names;
    for (const TensorEntry& e : table) names.push_back(e.name);
    const uint64_t names_hash = HashTensorNames(names);
    const auto deadline = t0 + std::chrono::milliseconds(opt_.parts_timeout_ms);
    std::vector<std::optional<PartList>> lists(opt_.ranks.size());
    size_t missing = opt_.ranks.size();
    for (;;) {
      const uint64_t since = store_->ChangeCount();
      if (!announced) {
        REFIT_ASSIGN_OR_RETURN(auto stored, store_->List(PartsPrefix(version)));
        if (!stored.empty()) REFIT_RETURN_IF_ERROR(announce());
      }
      for (size_t i = 0; i < opt_.ranks.size(); ++i) {
        if (lists[i]) continue;
        const uint32_t rank = opt_.ranks[i];
        REFIT_ASSIGN_OR_RETURN(auto got, GetIfStored(store_, PartListKey(version, rank)));
        if (!got) continue;
        REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> body, opt_.auth.Open(*got));
        REFIT_ASSIGN_OR_RETURN(PartList l, DecodePartList(body));
        const std::string who = "rank " + std::to_string(rank) + "'s part of version " + V;
        if (l.version != version || l.rank != rank) {
          return DataLossError(who + " names version " + std::to_string(l.version) +
                               ", rank " + std::to_string(l.rank));
        }
        if (l.base_version != base) {
          return FailedPreconditionError(who + " was encoded against version " +
                                         std::to_string(l.base_version) +
                                         "; the committed version is " + std::to_string(base));
        }
        if (l.tensor_count != table.size() || l.names_hash != names_hash) {
          return FailedPreconditionError(who + " indexes another set of canonical tensors "
                                         "than the version's table");
        }
        for (size_t k = 0; k < l.chunks.size(); ++k) {
          const PartEntry& e = l.chunks[k];
          const uint64_t span = e.run == 0 ? e.count : (e.count / e.run - 1) * e.stride + e.run;
          if (e.tensor_id >= table.size() || e.start > table[e.tensor_id].num_elements ||
              span > table[e.tensor_id].num_elements - e.start) {
            return DataLossError(who + " lists chunk " + std::to_string(k) +
                                 " outside its tensor");
          }
        }
        lists[i] = std::move(l);
        --missing;
      }
      if (missing == 0) break;
      if (Clock::now() >= deadline) {
        std::string absent;
        for (size_t i = 0; i < opt_.ranks.size(); ++i) {
          if (!lists[i]) absent += (absent.empty() ? "" : ", ") + std::to_string(opt_.ranks[i]);
        }
        return DeadlineExceededError("version " + V + ": no part from rank(s) " + absent +
                                     " within " + std::to_string(opt_.parts_timeout_ms) +
                                     " ms; nothing was published");
      }
      store_->AwaitChange(since, opt_.poll_ms);
    }
    report.wait_seconds = Since(t0);

    // 3. The manifest, from the lists alone.
    auto t1 = Clock::now();
    if (!announced) REFIT_RETURN_IF_ERROR(announce());
    Manifest m;
    m.version = version;
    m.base_version = base;
    m.members = opt_.members;
    m.direct = true;
    m.tensors = table;
    std::vector<bool> touched(table.size(), false);
    for (size_t i = 0; i < lists.size(); ++i) {
      for (size_t k = 0; k < lists[i]->chunks.size(); ++k) {
        const PartEntry& e = lists[i]->chunks[k];
        ManifestChunk c;
        c.size = e.size;
        c.sha256 = e.sha256;
        c.tensor_id = e.tensor_id;
        c.start = e.start;
        c.count = e.count;
        c.run = e.run;
        c.stride = e.stride;
        c.changed = e.changed;
        c.kind = e.kind;
        c.in_part = true;
        c.rank = opt_.ranks[i];
        c.part_index = k;
        c.pack_offset = e.pack_offset;
        m.chunks.push_back(c);
        touched[e.tensor_id] = true;
        report.part_bytes += e.size;
        report.changed_elements += e.changed;
      }
    }
    // Tensor order, as receivers check the base tensor by tensor.
    std::stable_sort(m.chunks.begin(), m.chunks.end(),
                     [](const ManifestChunk& a, const ManifestChunk& b) {
                       return a.tensor_id != b.tensor_id ? a.tensor_id < b.tensor_id
                                                         : a.start < b.start;
                     });
    report.part_chunks = m.chunks.size();
    for (size_t t = 0; t < table.size(); ++t) {
      m.tensors[t].after = touched[t] ? Hash128{} : table[t].before;
    }
    REFIT_RETURN_IF_ERROR(
        PutOnce(store_, ManifestKey(version), opt_.auth.Seal(EncodeManifest(m)), kConflict));
    report.manifest_seconds = Since(t1);

    // 4. Votes and the one decision.
    REFIT_ASSIGN_OR_RETURN(Decision d, VoteAndDecide(m, std::move(touched), &report));
    decision = d;
  }
  report.committed = decision->commit;
  report.reason = decision->reason;
  if (decision->commit) {
    committed_ = version;
    REFIT_RETURN_IF_ERROR(store_->Put(kHeadKey, opt_.auth.Seal(EncodeHead(version))));
  }
  report.seconds = Since(t0);
  return report;
}

}  // namespace refit::ranks
