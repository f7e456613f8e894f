// A receiver's state directory (sync/state_dir.h): its files' names and
// the "active" pointer's reading and writing.
#include "sync/state_dir.h"

#include <gtest/gtest.h>

#include "base/file.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::TempDir;

TEST(StateDirTest, NamesTheFilesOfTheLayout) {
  StateDir s("/x/state");
  EXPECT_EQ(s.path(), "/x/state");
  EXPECT_EQ(s.active_path(), "/x/state/active");
  EXPECT_EQ(s.journal_path(), "/x/state/journal");
  EXPECT_EQ(s.snapshot_path(), "/x/state/snapshot");
  EXPECT_EQ(s.last_error_path(), "/x/state/last_error");
}

TEST(StateDirTest, ActiveVersionRoundTripsAndIsZeroWhenAbsent) {
  TempDir dir;
  StateDir s(dir.path());
  auto none = s.ReadActive();
  ASSERT_OK(none);
  EXPECT_EQ(*none, 0u);
  ASSERT_OK(s.WriteActive(18446744073709551615ull));
  EXPECT_EQ(testing::ReadBytes(s.active_path()),
            std::vector<uint8_t>({'1', '8', '4', '4', '6', '7', '4',
                                  '4', '0', '7', '3', '7', '0', '9',
                                  '5', '5', '1', '6', '1', '5', '\n'}));
  EXPECT_EQ(*s.ReadActive(), 18446744073709551615ull);
  ASSERT_OK(s.WriteActive(7));
  EXPECT_EQ(*s.ReadActive(), 7u);
}

TEST(StateDirTest, CorruptActivePointerIsDataLoss) {
  TempDir dir;
  StateDir s(dir.path());
  testing::WriteBytes(s.active_path(), {'x', '\n'});
  auto bad = s.ReadActive();
  EXPECT_THAT(bad, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(bad.status().message().find("active pointer '" + s.active_path() +
                                        "' is corrupt"),
            std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace refit
