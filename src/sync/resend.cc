#include "sync/resend.h"

#include <cstring>

#include "codec/payload.h"
#include "sync/keys.h"
#include "sync/protocol.h"

namespace refit {

Result<std::vector<uint8_t>> MakeResend(const ParsedChunk& original,
                                        const uint8_t* desired, bool after) {
  const ChunkHeader& h = original.header;
  const int w = h.width;
  const uint32_t n = static_cast<uint32_t>(h.count);
  const uint32_t k = static_cast<uint32_t>(h.changed);
  ChunkHeader r = h;
  r.before = after ? h.before : h.after;
  r.after = after ? h.after : h.before;
  std::vector<uint8_t> payload;
  codec::EncodeOptions opt;
  if (h.IsSparse()) {
    std::vector<uint32_t> pos(k);
    std::vector<uint8_t> vals(static_cast<size_t>(k) * w);
    REFIT_RETURN_IF_ERROR(codec::DecodeSparse(original.payload, h.kind, n, w, k,
                                              pos.data(), vals.data()));
    for (uint32_t i = 0; i < k; ++i) {
      std::memcpy(vals.data() + static_cast<size_t>(i) * w,
                  desired + static_cast<size_t>(pos[i]) * w, static_cast<size_t>(w));
    }
    r.kind = codec::ChunkKind::kSparseOverwrite;
    REFIT_RETURN_IF_ERROR(codec::EncodeSparse(r.kind, n, w, pos, vals.data(), opt, &payload));
  } else {
    r.kind = codec::ChunkKind::kRaw;
    REFIT_RETURN_IF_ERROR(codec::EncodeDense(n, w, desired, opt, &payload));
  }
  std::vector<uint8_t> out;
  SerializeChunk(r, payload, &out);
  return out;
}

Status ServeResends(ObjectStore* store, const Authenticator& auth, uint64_t version,
                    std::map<std::string, Sha256>* served, const ResendFn& resend,
                    uint64_t* count) {
  REFIT_ASSIGN_OR_RETURN(auto requests, store->List(RequestPrefix(version)));
  for (const ObjectInfo& info : requests) {
    std::optional<KeyInfo> key = ParseKey(info.key);
    if (!key || key->kind != KeyInfo::Kind::kRequest) continue;
    REFIT_ASSIGN_OR_RETURN(auto bytes, store->Get(info.key));
    const Sha256 sha = ComputeSha256(bytes);
    auto it = served->find(info.key);
    if (it != served->end() && it->second == sha) continue;
    const std::string& member = key->member;
    auto body = auth.OpenMember(bytes);
    if (!body.ok()) continue;  // not from a member holding the key: ignore
    auto q = DecodeRequest(*body);
    if (!q.ok()) continue;
    for (size_t j = 0; j < q->chunks.size(); ++j) {
      const uint64_t i = q->chunks[j];
      const bool after = q->after[j];
      REFIT_ASSIGN_OR_RETURN(std::optional<std::vector<uint8_t>> r, resend(i, after));
      if (!r) continue;
      REFIT_RETURN_IF_ERROR(store->Put(ResendKey(version, member, i, after), auth.Seal(*r)));
      ++*count;
    }
    (*served)[info.key] = sha;
  }
  return Status();
}

}  // namespace refit
