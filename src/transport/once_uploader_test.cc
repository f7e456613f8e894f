#include "transport/once_uploader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "transport/memory_store.h"

namespace refit {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// What Prepare leaves is what is stored and counted, for every object, with
// several objects prepared at once on the pool.
TEST(OnceUploaderTest, StoresWhatPrepareLeaves) {
  MemoryStore store;
  OnceUploader up(&store, 3, "conflict");
  for (int i = 0; i < 20; ++i) {
    const std::string body = "object " + std::to_string(i);
    ASSERT_TRUE(up.Add("k" + std::to_string(i), Bytes(body),
                       [](std::vector<uint8_t>* b) {
                         b->insert(b->begin(), {'[', '['});
                         b->push_back(']');
                       })
                    .ok());
  }
  ASSERT_TRUE(up.Add("plain", Bytes("as is")).ok());
  ASSERT_TRUE(up.Finish().ok());
  uint64_t expected = 5;  // "as is"
  for (int i = 0; i < 20; ++i) {
    const std::string body = "object " + std::to_string(i);
    auto got = store.Get("k" + std::to_string(i));
    ASSERT_TRUE(got.ok()) << i;
    EXPECT_EQ(std::string(got->begin(), got->end()), "[[" + body + "]");
    expected += body.size() + 3;
  }
  auto plain = store.Get("plain");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::string(plain->begin(), plain->end()), "as is");
  EXPECT_EQ(up.bytes(), expected);
}

// A key already holding other bytes is refused with the caller's message,
// and Add refuses new objects after that failure.
TEST(OnceUploaderTest, ConflictIsReportedAfterPrepare) {
  MemoryStore store;
  ASSERT_TRUE(store.Put("k", Bytes("other")).ok());
  OnceUploader up(&store, 1, "started with other tensors");
  ASSERT_TRUE(up.Add("k", Bytes("mine"), [](std::vector<uint8_t>* b) { b->push_back('!'); }).ok());
  Status s = up.Finish();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("started with other tensors"), std::string::npos) << s.ToString();
  EXPECT_FALSE(up.Add("k2", Bytes("late")).ok());
}

}  // namespace
}  // namespace refit
