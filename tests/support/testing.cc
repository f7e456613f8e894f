#include "support/testing.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace refit::testing {

std::string FixturesDir() {
  const char* env = getenv("REFIT_FIXTURES_DIR");
  std::string base = env ? env : "../shared/fixtures";
  std::string dir = base + "/qwen2-tiny";
  if (std::filesystem::exists(dir + "/step0.safetensors")) return dir;
  return "";
}

TempDir::TempDir() {
  const char* t = getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/refit_test_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* p = mkdtemp(buf.data());
  path_ = p ? p : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()),
          static_cast<std::streamsize>(data.size()));
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace refit::testing
