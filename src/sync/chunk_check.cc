#include "sync/chunk_check.h"

#include <string>

namespace refit::internal {

bool FailsItsChecks(const Status& s) {
  return s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kUnauthenticated;
}

bool SameTensor(const TensorEntry& x, const TensorEntry& y) {
  return x.name == y.name && x.dtype == y.dtype && x.width == y.width && x.shape == y.shape;
}

bool RangeInside(const std::vector<TensorEntry>& tensors, uint64_t tensor, uint64_t start,
                 uint64_t count) {
  return tensor < tensors.size() && count > 0 && start <= tensors[tensor].num_elements &&
         count <= tensors[tensor].num_elements - start;
}

bool ManifestMatches(const Announcement& a, const Manifest& m) {
  bool same = m.base_version == a.base_version && m.members == a.members &&
              m.tensors.size() == a.tensors.size();
  for (size_t t = 0; same && t < m.tensors.size(); ++t) {
    same = SameTensor(m.tensors[t], a.tensors[t]) && m.tensors[t].before == a.tensors[t].before;
  }
  return same;
}

namespace {

std::string ChunkName(const ChunkSpec& spec) {
  return std::string(spec.resend ? "the re-send of " : "") + "chunk " +
         std::to_string(spec.index) + " of version " + std::to_string(spec.version->version);
}

const ManifestChunk* EntryOf(const ChunkSpec& spec) {
  return spec.manifest != nullptr && spec.index < spec.manifest->chunks.size()
             ? &spec.manifest->chunks[spec.index]
             : nullptr;
}

}  // namespace

Result<ParsedChunk> CheckChunk(std::span<const uint8_t> object,
                               const ChunkSpec& spec, const Authenticator& auth,
                               std::span<const uint8_t>* chunk_bytes) {
  const ManifestChunk* entry = EntryOf(spec);
  if (!spec.resend && spec.manifest != nullptr &&
      (entry == nullptr || object.size() != entry->size ||
       ComputeSha256(object) != entry->sha256)) {
    return DataLossError(ChunkName(spec) + " does not match its manifest hash");
  }
  REFIT_ASSIGN_OR_RETURN(auto body, auth.Open(object));
  REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
  REFIT_RETURN_IF_ERROR(CheckParsedChunk(c, spec));
  if (chunk_bytes != nullptr) *chunk_bytes = body.first(c.size);
  return c;
}

Status CheckParsedChunk(const ParsedChunk& c, const ChunkSpec& spec) {
  const Announcement& a = *spec.version;
  const ManifestChunk* entry = EntryOf(spec);
  const std::string name = ChunkName(spec);
  const ChunkHeader& h = c.header;
  if (h.IsStrided() && !spec.before_manifest && (entry == nullptr || entry->run == 0)) {
    // A strided region (a rank's block of a matrix) is taken only where
    // the manifest lists one: receivers stage those chunks after it.
    return DataLossError(name + " is a strided region its manifest does not list");
  }
  // ParseChunk checked the region's form; End() is its last element + 1.
  if (!RangeInside(a.tensors, h.tensor_id, h.start, h.End() - h.start) ||
      h.width != a.tensors[h.tensor_id].width) {
    return DataLossError(name + " names a range outside the announced tensors");
  }
  if (h.version != a.version || h.base_version != a.base_version) {
    return DataLossError(name + " belongs to another version");
  }
  if (entry != nullptr &&
      (h.tensor_id != entry->tensor_id || h.start != entry->start || h.count != entry->count ||
       h.run != entry->run || (h.run != 0 && h.stride != entry->stride) ||
       (!spec.resend && h.kind != static_cast<codec::ChunkKind>(entry->kind)))) {
    return DataLossError(name + " does not match its manifest entry");
  }
  if (spec.resend && h.kind != codec::ChunkKind::kSparseOverwrite &&
      h.kind != codec::ChunkKind::kRaw) {
    return DataLossError(name + " is not an overwrite");
  }
  return Status();
}

}  // namespace refit::internal
