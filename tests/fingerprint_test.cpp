// The checkpoint fingerprint: every byte counts, the cache beside the checkpoint is used only
// for files that are provably the ones hashed, and a damaged or unwritable cache changes nothing
// but the time it takes.
#include "model/fingerprint.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <algorithm>
#include <filesystem>
#include <thread>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

// A copy of the tiny checkpoint that a test may change.
std::string tiny_copy(const std::string& name) {
  const std::string dir = test::temp_dir(name);
  for (const auto& e : fs::directory_iterator(test::tiny_model_dir()))
    if (e.path().extension() == ".safetensors" || e.path().extension() == ".json")
      if (e.path().filename() != kFingerprintCacheName) fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  return dir;
}

std::vector<std::string> shards(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(Fingerprint, EveryByteCounts) {
  const std::string dir = tiny_copy("fp-bytes");
  const std::string before = TensorStore(dir).fingerprint();
  EXPECT_EQ(before.rfind("xxh3-128:", 0), 0u) << before;
  EXPECT_EQ(before, TensorStore(test::tiny_model_dir()).fingerprint()) << "same bytes, same fingerprint";
  // One bit in the middle of the file, away from any 4 KiB edge or sampled stride.
  const std::string shard = shards(dir).back();
  const auto size = fs::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(size / 2 + 37));
    char c = 0;
    f.read(&c, 1);
    c ^= 1;
    f.seekp(std::streamoff(size / 2 + 37));
    f.write(&c, 1);
  }
  EXPECT_NE(TensorStore(dir).fingerprint(), before);
}

TEST(Fingerprint, CacheIsWrittenAndUsedOnlyForTheSameFile) {
  const std::string dir = tiny_copy("fp-cache");
  const std::string cache = (fs::path(dir) / kFingerprintCacheName).string();
  // A file changed within the last two seconds is not cached: its times may not move on the
  // next write.
  const std::string fp = TensorStore(dir).fingerprint();
  EXPECT_FALSE(fs::exists(cache));
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_EQ(TensorStore(dir).fingerprint(), fp);
  ASSERT_TRUE(fs::is_regular_file(cache));
  nlohmann::json j = read_json(cache);
  ASSERT_EQ(j["files"].size(), shards(dir).size());
  EXPECT_EQ(j["fingerprint"], fp);

  // The cache is what a second load uses: a forged hash under the same key shows through.
  const std::string real = j["files"].back()["xxh3_128"];
  j["files"].back()["xxh3_128"] = std::string(32, '0');
  std::ofstream(cache) << j.dump();
  const std::string forged = TensorStore(dir).fingerprint();
  EXPECT_NE(forged, fp) << "the cached hash was not used";

  // A file rewritten with the same size and its old mtime restored still has a new ctime:
  // hashed again, and the cache repaired.
  const std::string shard = shards(dir).back();
  struct stat st {};
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  const std::string copy = shard + ".copy";
  fs::copy_file(shard, copy);
  fs::rename(copy, shard);
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, shard.c_str(), times, 0), 0);
  EXPECT_EQ(TensorStore(dir).fingerprint(), fp);
  // Too recent to cache again: the forged entry is gone rather than repaired.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_EQ(TensorStore(dir).fingerprint(), fp);
  EXPECT_EQ(read_json(cache)["files"].back()["xxh3_128"], real);
}

TEST(Fingerprint, DamagedOrForeignCacheIsAMiss) {
  const std::string dir = tiny_copy("fp-damaged");
  const std::string cache = (fs::path(dir) / kFingerprintCacheName).string();
  const std::string fp = TensorStore(dir).fingerprint();
  for (const std::string& text : {std::string("{"), std::string(100000, '['), std::string("[1,2]"),
                                 std::string(R"({"schema":1,"files":[{"name":7}]})"),
                                 std::string(R"({"schema":1,"files":[{"name":"model.safetensors","xxh3_128":"zz"}]})"),
                                 std::string("1e400")}) {
    std::ofstream(cache) << text;
    EXPECT_EQ(TensorStore(dir).fingerprint(), fp) << text.substr(0, 60);
  }
  // A directory where the cache would go: not replaced, not an error.
  fs::remove(cache);
  fs::create_directory(cache);
  EXPECT_EQ(TensorStore(dir).fingerprint(), fp);
  EXPECT_TRUE(fs::is_directory(cache));
}

TEST(Fingerprint, ReadOnlyCheckpointIsHashedEveryTime) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: a read-only directory is writable";
  const std::string dir = tiny_copy("fp-readonly");
  const std::string fp = TensorStore(dir).fingerprint();
  fs::remove(fs::path(dir) / kFingerprintCacheName);
  fs::permissions(dir, fs::perms::owner_write, fs::perm_options::remove);
  EXPECT_EQ(TensorStore(dir).fingerprint(), fp);
  EXPECT_FALSE(fs::exists(fs::path(dir) / kFingerprintCacheName));
  fs::permissions(dir, fs::perms::owner_write, fs::perm_options::add);
}

}  // namespace
}  // namespace parity
