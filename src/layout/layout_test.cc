// Layouts: JSON round trip, validation of bad layouts, ownership and the
// coverage proof on hand-made and random (seeded) layouts.
#include "layout/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/status_matchers.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::layout {
namespace {

using ::refit::testing::StatusIs;

using testing::AssembleCanonical;
using testing::ScatterToRanks;
using testing::TensorBytes;

Piece Rows(std::string canonical, uint64_t rows, uint64_t cols, uint64_t local_offset,
           uint64_t canon_offset, uint64_t local_width, uint64_t canon_width) {
  return {std::move(canonical), rows, cols, local_offset, local_width, 1,
          canon_offset, canon_width, 1};
}

// A [8, 6] BF16 tensor "w", TP-split by rows over ranks 0 and 1, with
// ranks 2 and 3 their data-parallel replicas; "b" [5] replicated on all.
Layout Small() {
  Layout l;
  l.canonical = {{"b", "BF16", {5}, "", "", 0, 0}, {"w", "BF16", {8, 6}, "", "", 0, 0}};
  for (uint32_t r = 0; r < 4; ++r) {
    RankLayout rl;
    rl.rank = r;
    uint64_t half = r % 2;
    rl.tensors.push_back({"w_local", "BF16", {4, 6}, {Rows("w", 4, 6, 0, half * 24, 6, 6)}});
    rl.tensors.push_back({"b_local", "BF16", {5}, {Rows("b", 1, 5, 0, 0, 5, 5)}});
    l.ranks.push_back(rl);
  }
  return l;
}

void ExpectError(const Layout& l, const std::string& needle) {
  Status s = ValidateLayout(l);
  ASSERT_FALSE(s.ok()) << "accepted a bad layout; expected: " << needle;
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find(needle), std::string_view::npos) << s.ToString();
  // Nothing downstream works on it either.
  EXPECT_FALSE(AssignOwnership(l).ok());
  EXPECT_FALSE(CheckCoverage(l, Ownership(l.ranks.size())).ok());
}

// Per canonical element, how many ranks own it (small tensors only).
std::map<std::string, std::vector<int>> OwnerCounts(const Layout& l, const Ownership& o) {
  std::map<std::string, std::vector<int>> counts;
  for (const CanonicalTensor& c : l.canonical) {
    uint64_t n = 1;
    for (uint64_t d : LogicalShape(c)) n *= d;
    counts[c.name].assign(n, 0);
  }
  for (const auto& rank : o) {
    for (const OwnedPiece& op : rank) {
      const Piece& p = op.piece;
      for (uint64_t r = 0; r < p.rows; ++r) {
        for (uint64_t c = 0; c < p.cols; ++c) {
          counts[p.canonical][p.canon_offset + r * p.canon_row_stride +
                              c * p.canon_col_stride]++;
        }
      }
    }
  }
  return counts;
}

TensorBytes RandomCanonical(const Layout& l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TensorBytes out;
  for (const CanonicalTensor& c : l.canonical) {
    uint64_t n = 1;
    for (uint64_t d : c.shape) n *= d;
    int w = *DTypeRegistry().ElementWidth(c.dtype);
    std::vector<uint8_t>& b = out[c.name];
    b.resize(n * static_cast<uint64_t>(w));
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  }
  return out;
}

// Every check a correct layout passes: validation, JSON round trip,
// ownership covering each element exactly once (proved, and counted the
// slow way), owned pieces carrying the right bytes, scatter + assemble.
void CheckAll(const Layout& l, uint64_t seed, const OwnershipOptions& opt = {},
              bool bytes = true) {
  ASSERT_OK(ValidateLayout(l));
  Result<Layout> back = ParseLayout(LayoutToJson(l));
  ASSERT_OK(back);
  EXPECT_TRUE(*back == l);
  Result<Ownership> owned = AssignOwnership(l, opt);
  ASSERT_OK(owned);
  ASSERT_OK(CheckCoverage(l, *owned));
  std::map<std::string, std::vector<int>> counts = OwnerCounts(l, *owned);
  std::set<std::string> derived;
  for (const CanonicalTensor& c : l.canonical) derived.insert({c.scale, GlobalScaleName(c)});
  for (const CanonicalTensor& c : l.canonical) {
    if (derived.count(c.name)) continue;
    const std::vector<int>& n = counts[c.name];
    for (size_t i = 0; i < n.size(); ++i) {
      ASSERT_EQ(n[i], 1) << c.name << " element " << i;
    }
  }
  if (!bytes) return;
  TensorBytes canon = RandomCanonical(l, seed);
  Result<std::vector<TensorBytes>> local = ScatterToRanks(l, canon);
  ASSERT_OK(local);
  Result<TensorBytes> again = AssembleCanonical(l, *local);
  ASSERT_OK(again);
  for (const CanonicalTensor& c : l.canonical) {
    if (c.name.ends_with("_scale")) continue;
    EXPECT_TRUE((*again)[c.name] == canon[c.name]) << c.name;
  }
  // Owned pieces read the canonical bytes from local storage.
  for (size_t ri = 0; ri < owned->size(); ++ri) {
    for (const OwnedPiece& op : (*owned)[ri]) {
      const LocalTensor& t = l.ranks[ri].tensors[op.tensor];
      const std::vector<uint8_t>& lb = (*local)[ri][t.name];
      const std::vector<uint8_t>& cb = canon[op.piece.canonical];
      size_t w = lb.size() / std::max<size_t>(1, [&] {
                   uint64_t n = 1;
                   for (uint64_t d : t.shape) n *= d;
                   return n;
                 }());
      const Piece& p = op.piece;
      for (uint64_t r = 0; r < p.rows; ++r) {
        for (uint64_t c = 0; c < p.cols; ++c) {
          uint64_t li = p.local_offset + r * p.local_row_stride + c * p.local_col_stride;
          uint64_t ci = p.canon_offset + r * p.canon_row_stride + c * p.canon_col_stride;
          ASSERT_EQ(0, std::memcmp(&lb[li * w], &cb[ci * w], w)) << t.name;
        }
      }
    }
  }
}

TEST(Layout, SmallLayoutPasses) {
  Layout l = Small();
  CheckAll(l, 1);
  OwnershipOptions split_all;
  split_all.min_split_bytes = 1;
  CheckAll(l, 2, split_all);
  // With splitting allowed, each half of w is shared by its two replicas.
  Result<Ownership> o = AssignOwnership(l, split_all);
  ASSERT_OK(o);
  for (size_t r = 0; r < 4; ++r) {
    uint64_t bytes = 0;
    for (const OwnedPiece& op : (*o)[r]) {
      if (op.piece.canonical == "w") bytes += PieceBytes(l, op.piece);
    }
    EXPECT_EQ(bytes, 24u) << "rank " << r;  // 2 of the 4 rows of its half
  }
}

TEST(Layout, JsonRoundTripKeepsEveryField) {
  Layout l = Small();
  l.canonical.push_back({"q", "F8_E4M3", {8, 8}, "q_scale", "per_block", 4, 4});
  l.canonical.push_back({"q_scale", "F32", {2, 2}, "", "", 0, 0});
  for (RankLayout& r : l.ranks) {
    r.tensors.push_back({"q_local", "BF16", {8, 8}, {Rows("q", 8, 8, 0, 0, 8, 8)}});
  }
  std::string json = LayoutToJson(l);
  Result<Layout> back = ParseLayout(json);
  ASSERT_OK(back);
  EXPECT_TRUE(*back == l);
  EXPECT_EQ(LayoutToJson(*back), json);
  ASSERT_OK(ValidateLayout(*back));
}

TEST(Layout, ParseRejectsMalformedJson) {
  std::string good = LayoutToJson(Small());
  ASSERT_OK(ParseLayout(good));
  struct Case {
    std::string from, to, needle;
  };
  std::vector<Case> cases = {
      {"\"format\": \"refit-layout\"", "\"format\": \"other\"", "not \"refit-layout\""},
      {"\"version\": 1", "\"version\": 2", "version 2 is not supported"},
      {"\"rows\":4", "\"rows\":-4", "\"rows\" is not a non-negative integer"},
      {"\"rows\":4", "\"rows\":4,\"rows\":4", "duplicate key"},
      {"\"rows\":4", "\"rowz\":4", "unknown field 'rowz'"},
      {"\"canon\":[0,6,1]", "\"canon\":[0,6]", "\"canon\" must be an array of 3"},
      {"\"dtype\":\"BF16\"", "\"dtype\":16", "\"dtype\" is not a string"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    size_t at = bad.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    bad.replace(at, c.from.size(), c.to);
    Result<Layout> r = ParseLayout(bad);
    ASSERT_FALSE(r.ok()) << c.to;
    EXPECT_NE(r.status().message().find(c.needle), std::string_view::npos)
        << r.status().ToString();
  }
  EXPECT_FALSE(ParseLayout("{\"format\": \"refit-layout\"").ok());
  EXPECT_FALSE(ParseLayout("[]").ok());
}

TEST(Layout, RejectsOverlappingPiecesOfOneLocalTensor) {
  Layout l = Small();
  // Rank 0's w_local grows a second piece over its rows 2..3.
  l.ranks[0].tensors[0].pieces.push_back(Rows("w", 2, 6, 12, 36, 6, 6));
  ExpectError(l, "rank 0, local tensor 'w_local', piece 1 (canonical 'w') overlaps piece 0");
}

TEST(Layout, RejectsGaps) {
  Layout l = Small();
  // Both replicas of the second half lose its last row.
  for (uint32_t r : {1u, 3u}) l.ranks[r].tensors[0].pieces[0].rows = 3;
  ExpectError(l, "canonical tensor 'w': gap: element 42 [7, 0] is mapped by no piece");
  Layout m = Small();
  for (RankLayout& r : m.ranks) r.tensors.pop_back();
  ExpectError(m, "canonical tensor 'b' is mapped by no piece");
}

TEST(Layout, RejectsShapeMismatches) {
  Layout l = Small();
  l.ranks[2].tensors[0].shape = {3, 6};
  ExpectError(l, "rank 2, local tensor 'w_local', piece 0 (canonical 'w'): local block");
  ExpectError(l, "past the local tensor's 18 elements (shape mismatch)");
  Layout m = Small();
  m.canonical[1].shape = {7, 6};
  ExpectError(m, "past the canonical tensor's 42 elements (shape mismatch)");
}

TEST(Layout, RejectsUnknownCanonicalNames) {
  Layout l = Small();
  l.ranks[3].tensors[1].pieces[0].canonical = "model.bias";
  ExpectError(l, "rank 3, local tensor 'b_local', piece 0 (canonical 'model.bias'): "
                 "unknown canonical tensor");
}

TEST(Layout, RejectsOtherBadLayouts) {
  {
    Layout l = Small();  // one rank maps the same elements twice
    l.ranks[0].tensors.push_back({"w_copy", "BF16", {6}, {Rows("w", 1, 6, 0, 0, 6, 6)}});
    ExpectError(l, "element 0 [0, 0] is mapped twice on one rank");
  }
  {
    Layout l = Small();  // replicas in different storage
    l.ranks[3].tensors[0].dtype = "F32";
    ExpectError(l, "replicas disagree on storage");
  }
  {
    Layout l = Small();  // neither canonical stride is 1
    l.ranks[0].tensors[0].pieces[0].canon_col_stride = 2;
    ExpectError(l, "not a strided range");
  }
  {
    Layout l = Small();  // runs that overlap each other
    l.ranks[0].tensors[0].pieces[0].canon_row_stride = 3;
    ExpectError(l, "overlaps itself");
  }
  {
    Layout l = Small();
    l.ranks[1].rank = 0;
    ExpectError(l, "rank 0 is listed twice");
  }
  {
    Layout l = Small();
    l.ranks[1].tensors[1].dtype = "I16";
    ExpectError(l, "local dtype I16 cannot hold canonical dtype BF16");
  }
  {
    Layout l = Small();
    l.ranks[1].tensors[1].dtype = "Q7";
    ExpectError(l, "rank 1, local tensor 'b_local'");
  }
  {
    Layout l = Small();
    l.canonical.push_back({"b", "BF16", {5}, "", "", 0, 0});
    ExpectError(l, "canonical tensor 'b' is listed twice");
  }
  {
    Layout l = Small();  // a scale of the wrong shape
    l.canonical.push_back({"w_scale", "F32", {3}, "", "", 0, 0});
    l.canonical[1].scale = "w_scale";
    l.canonical[1].scale_kind = "per_block";
    l.canonical[1].block_rows = 4;
    l.canonical[1].block_cols = 3;
    ExpectError(l, "per_block scale 'w_scale' should have 2 x 2 elements");
  }
  {
    Layout l = Small();  // pieces may not map a derived scale tensor
    l.canonical.push_back({"w_scale", "F32", {1}, "", "", 0, 0});
    l.canonical[1].scale = "w_scale";
    l.canonical[1].scale_kind = "per_tensor";
    l.ranks[0].tensors.push_back({"s", "F32", {1}, {Rows("w_scale", 1, 1, 0, 0, 1, 1)}});
    ExpectError(l, "maps a scale tensor");
  }
}

TEST(Layout, CoverageCheckNamesOverlapsAndGaps) {
  Layout l = Small();
  OwnershipOptions opt;
  opt.min_split_bytes = 1;
  Result<Ownership> o = AssignOwnership(l, opt);
  ASSERT_OK(o);
  ASSERT_OK(CheckCoverage(l, *o));
  {
    Ownership twice = *o;  // rank 0 also claims what rank 2 owns of w
    for (const OwnedPiece& op : (*o)[2]) {
      if (op.piece.canonical == "w") twice[0].push_back(op);
    }
    Status s = CheckCoverage(l, twice);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("ownership of canonical tensor 'w': overlap: element"),
              std::string_view::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("owned twice, by rank"), std::string_view::npos);
  }
  {
    Ownership gap = *o;
    gap[3].clear();
    Status s = CheckCoverage(l, gap);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(": gap: element"), std::string_view::npos) << s.ToString();
    EXPECT_NE(s.message().find("is owned by no rank"), std::string_view::npos);
  }
  {
    Ownership wrong = *o;  // a piece that rank 0's storage does not hold
    wrong[0][0].piece.canon_offset += 1;
    Status s = CheckCoverage(l, wrong);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("is not part of any piece of local tensor"),
              std::string_view::npos)
        << s.ToString();
  }
  {
    Ownership short_list(3);
    EXPECT_FALSE(CheckCoverage(l, short_list).ok());
  }
}

// Quantized tensors: ownership never cuts a quantization block.
TEST(Layout, OwnershipKeepsQuantizationBlocksWhole) {
  for (bool transposed : {false, true}) {
    Layout l;
    // "q" [24, 16] F8 in blocks of 4 x bc; "t" per-tensor quantized.
    const uint64_t bc = transposed ? 4 : 8;
    l.canonical = {{"q", "F8_E4M3", {24, 16}, "q_scale", "per_block", 4, bc},
                   {"q_scale", "F32", {6, 16 / bc}, "", "", 0, 0},
                   {"t", "F8_E4M3", {6, 16}, "t_scale", "per_tensor", 0, 0},
                   {"t_scale", "F32", {1}, "", "", 0, 0}};
    for (uint32_t r = 0; r < 3; ++r) {  // three replicas
      RankLayout rl;
      rl.rank = r;
      if (!transposed) {
        rl.tensors.push_back({"q", "BF16", {24, 16}, {Rows("q", 24, 16, 0, 0, 16, 16)}});
      } else {
        // Stored [16, 24]; as two pieces of 8 canonical columns each.
        LocalTensor t{"q", "BF16", {16, 24}, {}};
        for (uint64_t h = 0; h < 2; ++h) {
          t.pieces.push_back({"q", 8, 24, h * 8 * 24, 24, 1, h * 8, 1, 16});
        }
        rl.tensors.push_back(t);
      }
      rl.tensors.push_back({"t", "BF16", {6, 16}, {Rows("t", 6, 16, 0, 0, 16, 16)}});
      l.ranks.push_back(rl);
    }
    OwnershipOptions opt;
    opt.min_split_bytes = 1;
    CheckAll(l, 7, opt, /*bytes=*/false);  // BF16 storage of F8: a cast
    Result<Ownership> o = AssignOwnership(l, opt);
    ASSERT_OK(o);
    // Owner of every element of q; each 4 x 8 block has one owner.
    std::vector<int> owner(24 * 16, -1);
    std::set<int> t_owners;
    for (size_t r = 0; r < o->size(); ++r) {
      for (const OwnedPiece& op : (*o)[r]) {
        const Piece& p = op.piece;
        if (p.canonical == "t") t_owners.insert(static_cast<int>(r));
        if (p.canonical != "q") continue;
        for (uint64_t a = 0; a < p.rows; ++a) {
          for (uint64_t b = 0; b < p.cols; ++b) {
            owner[p.canon_offset + a * p.canon_row_stride + b * p.canon_col_stride] =
                static_cast<int>(r);
          }
        }
      }
    }
    std::set<int> q_owners(owner.begin(), owner.end());
    EXPECT_EQ(q_owners.size(), 3u) << "q should be shared by its three replicas";
    for (uint64_t i = 0; i < 24 * 16; ++i) {
      uint64_t corner = (i / 16) / 4 * 4 * 16 + (i % 16) / bc * bc;
      ASSERT_EQ(owner[i], owner[corner]) << "block cut at element " << i
                                         << (transposed ? " (transposed)" : "");
    }
    EXPECT_EQ(t_owners.size(), 1u) << "a per_tensor tensor is owned whole";
  }
}

// Packed FP4 tensors: pieces map logical elements (two a byte), ownership
// cuts MXFP4 replicas only between 32-element blocks and never cuts an
// NVFP4 tensor (its global scale is the whole tensor's amax).
Layout Packed() {
  Layout l;
  l.canonical = {{"e", "U8", {2, 4, 2, 16}, "e_scales", "mxfp4", 0, 0},  // logical [2, 4, 64]
                 {"e_scales", "U8", {2, 4, 2}, "", "", 0, 0},
                 {"r", "U8", {1, 6, 16}, "r_scales", "mxfp4", 0, 0},  // logical [1, 192]
                 {"r_scales", "U8", {1, 6}, "", "", 0, 0},
                 {"n", "U8", {8, 16}, "n_scale", "nvfp4", 0, 0},  // logical [8, 32]
                 {"n_scale", "F8_E4M3", {8, 2}, "", "", 0, 0},
                 {"n_scale_2", "F32", {}, "", "", 0, 0}};
  for (uint32_t r = 0; r < 3; ++r) {  // three replicas
    RankLayout rl;
    rl.rank = r;
    rl.tensors.push_back({"e", "BF16", {8, 64}, {Rows("e", 8, 64, 0, 0, 64, 64)}});
    rl.tensors.push_back({"r", "F32", {192}, {Rows("r", 1, 192, 0, 0, 192, 192)}});
    rl.tensors.push_back({"n", "BF16", {8, 32}, {Rows("n", 8, 32, 0, 0, 32, 32)}});
    l.ranks.push_back(rl);
  }
  return l;
}

TEST(Layout, PackedFp4TensorsMapLogicalElementsAndKeepBlocksWhole) {
  const Layout l = Packed();
  EXPECT_EQ(LogicalShape(l.canonical[0]), (std::vector<uint64_t>{2, 4, 64}));
  EXPECT_EQ(LogicalShape(l.canonical[4]), (std::vector<uint64_t>{8, 32}));
  EXPECT_EQ(PackedBlock(l.canonical[0]), 32u);
  EXPECT_EQ(PackedBlock(l.canonical[4]), 16u);
  EXPECT_EQ(GlobalScaleName(l.canonical[4]), "n_scale_2");
  EXPECT_EQ(GlobalScaleName(l.canonical[0]), "");
  OwnershipOptions opt;
  opt.min_split_bytes = 1;
  CheckAll(l, 11, opt, /*bytes=*/false);  // BF16 / F32 storage: a conversion
  Result<Ownership> o = AssignOwnership(l, opt);
  ASSERT_OK(o);
  std::map<std::string, std::set<size_t>> owners;
  for (size_t r = 0; r < o->size(); ++r) {
    for (const OwnedPiece& op : (*o)[r]) {
      const Piece& p = op.piece;
      owners[p.canonical].insert(r);
      if (p.canonical == "n") continue;
      // Runs of whole blocks: starts and lengths multiples of 32.
      EXPECT_EQ(p.canon_offset % 32, 0u) << p.canonical;
      EXPECT_EQ(p.cols % 32, 0u) << p.canonical;
    }
  }
  EXPECT_EQ(owners["e"].size(), 3u);
  EXPECT_EQ(owners["r"].size(), 3u);  // cut at logical columns 64 and 128
  EXPECT_EQ(owners["n"].size(), 1u);
  {
    Layout b = Packed();  // a piece past the logical end
    b.ranks[0].tensors[0] = {"e", "BF16", {9, 64}, {Rows("e", 9, 64, 0, 0, 64, 64)}};
    ExpectError(b, "past the canonical tensor's 512 elements");
  }
  {
    Layout b = Packed();
    b.canonical[0].shape = {2, 4, 4, 8};
    ExpectError(b, "shape must be [..., C/32, 16]");
  }
  {
    Layout b = Packed();
    b.canonical[1].dtype = "F32";
    ExpectError(b, "scale tensor 'e_scales' must be 16 U8 element(s), one per 32 elements");
  }
  {
    Layout b = Packed();
    b.canonical[6].name = "n_global";
    ExpectError(b, "its global scale 'n_scale_2' must be a canonical F32 tensor of 1 element");
  }
  {
    Layout b = Packed();
    b.ranks[1].tensors[2].dtype = "U8";
    ExpectError(b, "local dtype U8 cannot hold canonical dtype U8");
  }
  {
    Layout b = Packed();
    b.canonical[4].block_rows = b.canonical[4].block_cols = 16;
    ExpectError(b, "its blocks are implied");
  }
}

// An NVFP4 or per-tensor FP8 tensor that each replica maps with several
// pieces (a fused tensor's groups in transposed storage) is owned whole by
// one replica: its global scale is the amax of all of it.
TEST(Layout, WholeTensorScalesKeepTheirPiecesOnOneOwner) {
  Layout l;
  l.canonical = {{"n", "U8", {8, 16}, "n_scale", "nvfp4", 0, 0},  // logical [8, 32]
                 {"n_scale", "F8_E4M3", {8, 2}, "", "", 0, 0},
                 {"n_scale_2", "F32", {}, "", "", 0, 0},
                 {"t", "F8_E4M3", {8, 32}, "t_scale", "per_tensor", 0, 0},
                 {"t_scale", "F32", {1}, "", "", 0, 0}};
  for (uint32_t r = 0; r < 3; ++r) {  // three replicas
    RankLayout rl;
    rl.rank = r;
    for (const char* name : {"n", "t"}) {
      // Stored [32, 8]: canonical rows 0-3 and 4-7 as two pieces.
      LocalTensor t{name, "BF16", {32, 8}, {}};
      for (uint64_t h = 0; h < 2; ++h) {
        t.pieces.push_back({name, 32, 4, h * 4, 8, 1, h * 4 * 32, 1, 32});
      }
      rl.tensors.push_back(t);
    }
    l.ranks.push_back(rl);
  }
  OwnershipOptions opt;
  opt.min_split_bytes = 1;
  CheckAll(l, 5, opt, /*bytes=*/false);
  Result<Ownership> o = AssignOwnership(l, opt);
  ASSERT_OK(o);
  std::map<std::string, std::set<size_t>> owners;
  std::map<std::string, size_t> pieces;
  for (size_t r = 0; r < o->size(); ++r) {
    for (const OwnedPiece& op : (*o)[r]) {
      owners[op.piece.canonical].insert(r);
      ++pieces[op.piece.canonical];
    }
  }
  EXPECT_EQ(owners["n"].size(), 1u);
  EXPECT_EQ(owners["t"].size(), 1u);
  EXPECT_EQ(pieces["n"], 2u);
  EXPECT_EQ(pieces["t"], 2u);
  EXPECT_NE(*owners["n"].begin(), *owners["t"].begin()) << "loads balance across tensors";
}

// Replicas whose pieces differ (one rank holds all of w, two others hold a
// half each) still get each element owned once.
TEST(Layout, OwnershipOfPartlyOverlappingReplicas) {
  Layout l;
  l.canonical = {{"w", "BF16", {10, 4}, "", "", 0, 0}};
  RankLayout a{0, {{"w", "BF16", {10, 4}, {Rows("w", 10, 4, 0, 0, 4, 4)}}}};
  RankLayout b{1, {{"w_top", "BF16", {3, 4}, {Rows("w", 3, 4, 0, 0, 4, 4)}}}};
  // Rank 2 stores its 7 rows transposed: [4, 7].
  RankLayout c{2, {{"w_bottom_t", "BF16", {4, 7}, {{"w", 4, 7, 0, 7, 1, 12, 1, 4}}}}};
  l.ranks = {a, b, c};
  OwnershipOptions opt;
  opt.min_split_bytes = 1;
  CheckAll(l, 3, opt);
  Result<Ownership> o = AssignOwnership(l, opt);
  ASSERT_OK(o);
  for (const auto& r : *o) EXPECT_FALSE(r.empty());
}

TEST(Layout, QuantizedReplicasThatOverlapInPartAreRefused) {
  Layout l;
  l.canonical = {{"q", "F8_E4M3", {8, 4}, "q_scale", "per_block", 4, 4},
                 {"q_scale", "F32", {2, 1}, "", "", 0, 0}};
  l.ranks = {RankLayout{0, {{"q", "F8_E4M3", {8, 4}, {Rows("q", 8, 4, 0, 0, 4, 4)}}}},
             RankLayout{1, {{"q_top", "F8_E4M3", {4, 4}, {Rows("q", 4, 4, 0, 0, 4, 4)}}}}};
  ASSERT_OK(ValidateLayout(l));
  Result<Ownership> o = AssignOwnership(l);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o, StatusIs(StatusCode::kUnimplemented));
  EXPECT_NE(o.status().message().find("replicas overlap only in part"),
            std::string_view::npos)
      << o.status().ToString();
}

TEST(Layout, CoverageRejectsOwnedPiecesOutsideTheirPiece) {
  Layout l = Small();
  Ownership o(4);
  // Rank 0 claims rows 2..5 of its 4-row piece, and a huge one.
  o[0].push_back({0, Rows("w", 4, 6, 12, 12, 6, 6)});
  Status s = CheckCoverage(l, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not part of any piece"), std::string_view::npos)
      << s.ToString();
  o[0][0].piece.rows = ~uint64_t{0};
  EXPECT_FALSE(CheckCoverage(l, o).ok());
  o[0][0] = {7, Rows("w", 1, 6, 0, 0, 6, 6)};  // no local tensor 7
  s = CheckCoverage(l, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("local tensor index 7 is out of range"),
            std::string_view::npos);
}

// Checks are arithmetic on runs: tensors of 2^40 elements cost nothing.
TEST(Layout, HugeTensorsAreCheckedWithoutTouchingElements) {
  const uint64_t kFlat = uint64_t{1} << 40, kSide = uint64_t{1} << 20;
  Layout l;
  l.canonical = {{"flat", "BF16", {kFlat}, "", "", 0, 0},
                 {"square", "BF16", {kSide, kSide}, "", "", 0, 0}};
  // 4 TP ranks split "square" by columns (row parallel), each with 3
  // data-parallel replicas; "flat" is replicated on all 12.
  for (uint32_t r = 0; r < 12; ++r) {
    uint64_t t = r % 4, w = kSide / 4;
    l.ranks.push_back(RankLayout{
        r,
        {{"flat", "BF16", {kFlat}, {Rows("flat", 1, kFlat, 0, 0, kFlat, kFlat)}},
         {"square", "BF16", {kSide, w}, {Rows("square", kSide, w, 0, t * w, w, kSide)}}}});
  }
  ASSERT_OK(ValidateLayout(l));
  Result<Ownership> o = AssignOwnership(l);
  ASSERT_OK(o);
  ASSERT_OK(CheckCoverage(l, *o));
  uint64_t total = 0;
  for (const auto& rank : *o) {
    uint64_t bytes = 0;
    for (const OwnedPiece& op : rank) bytes += PieceBytes(l, op.piece);
    // Equal shares, up to rounding of the cuts (a row of "square" each).
    uint64_t share = (kFlat + kSide * kSide) * 2 / 12;
    EXPECT_LE(std::max(bytes, share) - std::min(bytes, share), 2 * 2 * kSide) << bytes;
    total += bytes;
  }
  EXPECT_EQ(total, (kFlat + kSide * kSide) * 2);
  // A gap of one element in the middle is still found.
  for (uint32_t r = 0; r < 12; r += 4) l.ranks[r].tensors[1].pieces[0].rows = kSide - 1;
  Status s = ValidateLayout(l);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gap: element " + std::to_string((kSide - 1) * kSide)),
            std::string_view::npos)
      << s.ToString();
}

// Random layouts: random canonical shapes split unevenly by rows or columns,
// parts replicated on random ranks, stored plainly, transposed, or in
// interleaved groups with padding rows; some tensors covered by two
// different partitions on disjoint rank sets.
Layout RandomLayout(std::mt19937_64& rng) {
  auto pick = [&](uint64_t lo, uint64_t hi) {  // inclusive
    return lo + rng() % (hi - lo + 1);
  };
  Layout l;
  uint64_t nranks = pick(1, 8);
  l.ranks.resize(nranks);
  for (uint64_t r = 0; r < nranks; ++r) l.ranks[r].rank = static_cast<uint32_t>(r * 3 + 1);
  uint64_t ncanon = pick(1, 6);
  for (uint64_t ci = 0; ci < ncanon; ++ci) {
    CanonicalTensor c;
    c.name = "t" + std::to_string(ci);
    c.dtype = pick(0, 1) ? "BF16" : "F32";
    bool one_d = pick(0, 3) == 0;
    uint64_t R = one_d ? 1 : pick(1, 30), C = pick(1, 30);
    c.shape = one_d ? std::vector<uint64_t>{C} : std::vector<uint64_t>{R, C};
    l.canonical.push_back(c);
    uint64_t partitions = nranks >= 2 && pick(0, 3) == 0 ? 2 : 1;
    std::vector<uint64_t> ranks(nranks);
    for (uint64_t r = 0; r < nranks; ++r) ranks[r] = r;
    std::shuffle(ranks.begin(), ranks.end(), rng);
    for (uint64_t part_set = 0; part_set < partitions; ++part_set) {
      // This partition's ranks.
      std::vector<uint64_t> pool;
      for (uint64_t i = 0; i < nranks; ++i) {
        if (partitions == 1 || i % 2 == part_set) pool.push_back(ranks[i]);
      }
      bool by_rows = !one_d && pick(0, 1);
      uint64_t extent = by_rows ? R : C;
      uint64_t nparts = pick(1, std::min<uint64_t>(4, extent));
      std::set<uint64_t> cut_set;
      while (cut_set.size() < nparts - 1) cut_set.insert(pick(1, extent - 1));
      std::vector<uint64_t> cuts = {0};
      cuts.insert(cuts.end(), cut_set.begin(), cut_set.end());
      cuts.push_back(extent);
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        uint64_t a = cuts[k], n = cuts[k + 1] - a;
        uint64_t rows = by_rows ? n : R, cols = by_rows ? C : n;
        uint64_t r0 = by_rows ? a : 0, c0 = by_rows ? 0 : a;
        std::vector<uint64_t> holders = pool;
        std::shuffle(holders.begin(), holders.end(), rng);
        holders.resize(pick(1, holders.size()));
        for (uint64_t h : holders) {
          LocalTensor t;
          t.name = c.name + ".part" + std::to_string(part_set) + "." + std::to_string(k);
          t.dtype = c.dtype;
          uint64_t style = one_d ? 0 : pick(0, 2);
          uint64_t pad = pick(0, 3);
          if (style == 0) {  // plain, padding rows at the end
            t.shape = one_d ? std::vector<uint64_t>{cols + pad}
                            : std::vector<uint64_t>{rows + pad, cols};
            t.pieces.push_back({c.name, rows, cols, 0, cols, 1, r0 * C + c0, C, 1});
          } else if (style == 1) {  // transposed [cols, rows + pad]
            uint64_t lr = rows + pad;
            t.shape = {cols, lr};
            t.pieces.push_back({c.name, cols, rows, 0, lr, 1, r0 * C + c0, 1, C});
          } else {  // groups of g rows, each followed by `pad` padding rows
            uint64_t g = pick(1, rows);
            uint64_t full = rows / g, tail = rows % g;
            t.shape = {(full + (tail ? 1 : 0)) * (g + pad), cols};
            t.pieces.push_back({c.name, full, g * cols, 0, (g + pad) * cols, 1,
                                r0 * C + c0, g * C, 1});
            if (cols != C) {  // a column part: the group is not one run
              t.pieces.clear();
              for (uint64_t j = 0; j < full; ++j) {
                t.pieces.push_back({c.name, g, cols, j * (g + pad) * cols, cols, 1,
                                    (r0 + j * g) * C + c0, C, 1});
              }
            }
            if (tail) {
              t.pieces.push_back({c.name, tail, cols, full * (g + pad) * cols, cols, 1,
                                  (r0 + full * g) * C + c0, C, 1});
            }
          }
          l.ranks[h].tensors.push_back(std::move(t));
        }
      }
    }
  }
  return l;
}

TEST(Layout, RandomLayoutsAreCoveredExactlyOnce) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 rng(seed);
    Layout l = RandomLayout(rng);
    SCOPED_TRACE("seed " + std::to_string(seed));
    OwnershipOptions opt;
    opt.min_split_bytes = seed % 2 ? 1 : 64;
    CheckAll(l, seed, opt);
    if (::testing::Test::HasFatalFailure()) return;
    // Dropping any one owned piece leaves a gap the check names.
    Result<Ownership> o = AssignOwnership(l, opt);
    ASSERT_OK(o);
    for (size_t r = 0; r < o->size(); ++r) {
      if ((*o)[r].empty()) continue;
      Ownership less = *o;
      less[r].erase(less[r].begin() + static_cast<long>(seed % less[r].size()));
      Status s = CheckCoverage(l, less);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("gap"), std::string_view::npos) << s.ToString();
      // Claiming a piece twice is an overlap.
      Ownership more = *o;
      more[r].push_back(more[r][seed % more[r].size()]);
      s = CheckCoverage(l, more);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("overlap"), std::string_view::npos) << s.ToString();
      break;
    }
  }
}

// Hostile numbers: every number of a valid layout's JSON replaced, one at a
// time, by a random or extreme value. Whatever parses either fails
// validation cleanly or is owned and covered exactly once (run under ASan
// and UBSan in CI).
TEST(Layout, MutatedLayoutsAreRejectedOrCovered) {
  std::mt19937_64 rng(4242);
  Layout base = RandomLayout(rng);
  std::string json = LayoutToJson(base);
  std::vector<size_t> numbers;  // offsets of digit runs
  for (size_t i = 0; i < json.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(json[i])) &&
        (i == 0 || !std::isdigit(static_cast<unsigned char>(json[i - 1])))) {
      numbers.push_back(i);
    }
  }
  ASSERT_FALSE(numbers.empty());
  const std::vector<std::string> extremes = {
      "0", "1", "2", "3", "18446744073709551615", "18446744073709551616",
      "9223372036854775808", "4294967296", "65536"};
  int accepted = 0;
  for (int iter = 0; iter < 400; ++iter) {
    size_t at = numbers[rng() % numbers.size()];
    size_t len = 0;
    while (at + len < json.size() &&
           std::isdigit(static_cast<unsigned char>(json[at + len]))) {
      ++len;
    }
    std::string value = iter % 2 ? extremes[rng() % extremes.size()]
                                  : std::to_string(rng() % 64);
    std::string mutated = json.substr(0, at) + value + json.substr(at + len);
    Result<Layout> l = ParseLayout(mutated);
    if (!l.ok()) continue;
    if (!ValidateLayout(*l).ok()) continue;
    ++accepted;
    OwnershipOptions opt;
    opt.min_split_bytes = 1;
    Result<Ownership> o = AssignOwnership(*l, opt);
    ASSERT_OK(o);
    ASSERT_OK(CheckCoverage(*l, *o));
  }
  EXPECT_GT(accepted, 0);  // some mutations (e.g. a rank id) stay valid
}

// Ownership is a pure function of the layout: every rank computes the same.
TEST(Layout, OwnershipIsDeterministic) {
  std::mt19937_64 rng(99);
  Layout l = RandomLayout(rng);
  Result<Ownership> a = AssignOwnership(l);
  Result<Ownership> b = AssignOwnership(*ParseLayout(LayoutToJson(l)));
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_TRUE(*a == *b);
}

}  // namespace
}  // namespace refit::layout
