#include "sync/host_staged_target.h"

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "delta/apply.h"
#include "delta/chunk.h"

namespace refit {

HostStagedTarget::HostStagedTarget(std::vector<MutableTensorView> tensors,
                                   uint64_t staging_limit)
    : tensors_(std::move(tensors)), staging_(staging_limit, "staging limit") {
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
}

Status HostStagedTarget::Check(const std::vector<TensorEntry>& table) {
  for (const TensorEntry& e : table) {
    auto it = by_name_.find(e.name);
    const MutableTensorView* t =
        it == by_name_.end() ? nullptr : &tensors_[it->second];
    if (t == nullptr || t->dtype != e.dtype || t->width != e.width ||
        t->shape != e.shape) {
      return FailedPreconditionError(
          "tensor '" + e.name +
          "' is not held here with the version's dtype and shape; "
          "these are not the version's tensors");
    }
  }
  return Status();
}

Result<uint8_t*> HostStagedTarget::Data(const std::vector<TensorEntry>& table,
                                        uint64_t tensor_id) {
  if (tensor_id >= table.size())
    return DataLossError("a chunk names a tensor outside its table");
  auto it = by_name_.find(table[tensor_id].name);
  if (it == by_name_.end()) {
    return FailedPreconditionError("tensor '" + table[tensor_id].name +
                                   "' is not held here");
  }
  return tensors_[it->second].data;
}

Result<std::vector<std::optional<Hash128>>> HostStagedTarget::Hashes(
    const std::vector<TensorEntry>& table) {
  REFIT_RETURN_IF_ERROR(Check(table));
  std::vector<std::optional<Hash128>> out;
  for (const TensorEntry& e : table) {
    const MutableTensorView& t = tensors_[by_name_[e.name]];
    out.push_back(
        RangeHash(t.data, e.num_elements * static_cast<uint64_t>(e.width)));
  }
  return out;
}

Status HostStagedTarget::Begin() {
  staging_.Clear();
  return Status();
}

Status HostStagedTarget::Add(size_t version,
                             const std::vector<TensorEntry>& table,
                             std::span<const uint8_t> chunk) {
  REFIT_RETURN_IF_ERROR(staging_.Charge(chunk.size()));
  staging_.items().push_back(Staged{version, &table,
                           std::vector<uint8_t>(chunk.begin(), chunk.end())});
  return Status();
}

Status HostStagedTarget::Seal() {
  for (const Staged& s : staging_.items()) {
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(s.bytes));
    REFIT_RETURN_IF_ERROR(Data(*s.table, c.header.tensor_id).status());
  }
  return Status();
}

Result<StagedApplyReport> HostStagedTarget::Apply() {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Staged>& staged = staging_.Retire();
  StagedApplyReport report;
  ApplyScratch scratch;
  struct Done {
    ParsedChunk chunk;
    uint8_t* data;
    UndoRecord undo;
  };
  std::vector<Done> done;
  Status failed;
  size_t last_version = SIZE_MAX;
  for (size_t i = 0; i < staged.size() && failed.ok(); ++i) {
    const Staged& s = staged[i];
    auto c = ParseChunk(s.bytes);
    if (!c.ok()) {
      failed = c.status();
      break;
    }
    auto data = Data(*s.table, c->header.tensor_id);
    if (!data.ok()) {
      failed = data.status();
      break;
    }
    const ChunkHeader& h = c->header;
    if (ClassifyRange(h, RegionHash(h, *data)) != RangeState::kBefore) {
      failed =
          DataLossError("chunk of tensor '" + (*s.table)[h.tensor_id].name +
                        "' at element " + std::to_string(h.start) +
                        ": its range does not hold the chunk's base");
      break;
    }
    Done d{*c, *data, {}};
    failed = ApplyChunkInPlace(d.chunk, d.data, &scratch, nullptr, &d.undo);
    if (failed.ok()) {
      done.push_back(std::move(d));
      if (s.version != last_version) ++report.versions;
      last_version = s.version;
    }
  }
  if (!failed.ok()) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      Status undone = UndoChunkInPlace(it->chunk, it->data, &scratch, it->undo);
      if (!undone.ok()) return RestoredError(failed, undone);
    }
    return RestoredError(failed, Status());
  }
  report.chunks = done.size();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return report;
}

Result<std::vector<Hash128>> HostStagedTarget::HashesAfter(
    const std::vector<TensorEntry>& table) {
  REFIT_RETURN_IF_ERROR(Check(table));
  // The staged chunks of each held tensor, in staging order (versions in
  // the order they apply).
  std::map<size_t, std::vector<ParsedChunk>> by_tensor;
  for (const Staged& s : staging_.items()) {
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(s.bytes));
    if (c.header.tensor_id >= s.table->size())
      return DataLossError("a chunk names a tensor outside its table");
    auto it = by_name_.find((*s.table)[c.header.tensor_id].name);
    if (it == by_name_.end()) continue;  // Seal() refuses it
    by_tensor[it->second].push_back(c);
  }
  std::vector<Hash128> out;
  std::vector<uint8_t> copy;
  ApplyScratch scratch;
  for (const TensorEntry& e : table) {
    const size_t i = by_name_.at(e.name);
    const uint64_t bytes = e.num_elements * static_cast<uint64_t>(e.width);
    auto chunks = by_tensor.find(i);
    if (chunks == by_tensor.end()) {
      out.push_back(RangeHash(tensors_[i].data, bytes));
      continue;
    }
    copy.assign(tensors_[i].data, tensors_[i].data + bytes);
    for (const ParsedChunk& c : chunks->second) {
      if (ClassifyRange(c.header, RegionHash(c.header, copy.data())) != RangeState::kBefore) {
        return DataLossError("chunk of tensor '" + e.name + "' at element " +
                             std::to_string(c.header.start) +
                             ": its range does not hold the chunk's base");
      }
      REFIT_RETURN_IF_ERROR(ApplyChunkInPlace(c, copy.data(), &scratch, nullptr, nullptr)
                                .WithContext("tensor '" + e.name + "'"));
    }
    out.push_back(RangeHash(copy.data(), bytes));
  }
  return out;
}

Status HostStagedTarget::Load(const TensorEntry& e,
                              std::span<const uint8_t> bytes) {
  auto it = by_name_.find(e.name);
  if (it == by_name_.end() ||
      bytes.size() != e.num_elements * static_cast<uint64_t>(e.width)) {
    return FailedPreconditionError("tensor '" + e.name +
                                   "' cannot be loaded here");
  }
  std::memcpy(tensors_[it->second].data, bytes.data(), bytes.size());
  return Status();
}

StagingUsage HostStagedTarget::usage() const {
  StagingUsage u;
  u.host_limit = staging_.limit();
  u.host_bytes = staging_.bytes();
  u.staged_payload = staging_.bytes();
  return u;
}

}  // namespace refit
