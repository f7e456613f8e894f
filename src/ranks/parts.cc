#include "ranks/parts.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "base/bytes.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "sync/protocol.h"
#include "transport/once_uploader.h"

namespace refit::ranks {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kPartMagic[8] = {'R', 'F', 'P', 'A', 'R', 'T', '0', '1'};
constexpr uint64_t kMaxPartChunks = uint64_t{1} << 24;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string Digits(uint64_t v, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llu", width, static_cast<unsigned long long>(v));
  return buf;
}

// Parts are written once; a rank re-running its part writes the same bytes.
constexpr char kPartConflict[] =
    "this version's part was started from other tensors or another baseline; publish a "
    "higher version";

}  // namespace

std::string PartChunkKey(uint64_t version, uint32_t rank, uint64_t k) {
  return "parts/" + Digits(version, 20) + "/" + Digits(rank, 10) + "/chunk/" + Digits(k, 10);
}
std::string PartListKey(uint64_t version, uint32_t rank) {
  return "parts/" + Digits(version, 20) + "/" + Digits(rank, 10) + "/list";
}

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
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(reinterpret_cast<const uint8_t*>(kPartMagic), 8);
  w.U64(l.version);
  w.U64(l.base_version);
  w.U32(l.rank);
  w.U64(l.tensor_count);
  w.U64(l.names_hash);
  w.Varint(l.chunks.size());
  for (const PartEntry& e : l.chunks) {
    w.Varint(e.size);
    w.Bytes(e.sha256.data(), e.sha256.size());
  }
  w.U64(XXH3_64bits(out.data(), out.size()));
  return out;
}

Result<PartList> DecodePartList(std::span<const uint8_t> body) {
  if (body.size() < 8 + 8 || std::memcmp(body.data(), kPartMagic, 8) != 0) {
    return DataLossError("not a part list (bad magic)");
  }
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
  if (n > kMaxPartChunks || n > r.remaining()) {
    return DataLossError("part list names " + std::to_string(n) + " chunks");
  }
  for (uint64_t i = 0; i < n; ++i) {
    PartEntry e;
    e.size = r.Varint();
    auto sha = r.Bytes(32);
    REFIT_RETURN_IF_ERROR(r.status("part list"));
    std::copy(sha.begin(), sha.end(), e.sha256.begin());
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
                                                           trainer::RankEncoder* encoder,
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
                                              const std::vector<TensorView>& local) {
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
  auto encoded = encoder_->Encode(
      version, committed_, local, [&](std::span<const uint8_t> chunk, const ChunkHeader&) {
        std::vector<uint8_t> sealed = opt_.auth.Seal(chunk);
        list.chunks.push_back({sealed.size(), ComputeSha256(sealed)});
        return up.Add(PartChunkKey(version, rank_, list.chunks.size() - 1), std::move(sealed));
      });
  Status finished = up.Finish();
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
      return d.commit;
    }
    if (got.status().code() != StatusCode::kNotFound) return got.status();
    if (Clock::now() >= deadline) {
      return DeadlineExceededError("no decision for version " + std::to_string(pending_) +
                                   " within " + std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
  }
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
  for (size_t i = 0; i < lists.size() && st.ok(); ++i) {
    const uint32_t rank = opt_.ranks[i];
    for (size_t k = 0; k < lists[i].chunks.size() && st.ok(); ++k) {
      const std::string key = PartChunkKey(version, rank, k);
      auto run = [&]() -> Status {
        REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> sealed, parts_->Get(key));
        const PartEntry& e = lists[i].chunks[k];
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
