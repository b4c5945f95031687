#include "model/fingerprint.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/error.h"
#include "model/untrusted.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kCacheSchema = 1;
constexpr uint64_t kMaxCacheBytes = uint64_t(1) << 20;  // a real one is a few hundred bytes per shard
// A file changed less than this long before it is hashed is not cached: file systems keep
// times at a coarse grain (ext4: a clock tick; some: a second), so a write landing in the same
// grain as the hash would leave size, inode and times unchanged and the cache stale. Past the
// margin, any later write moves ctime past the cached one.
constexpr int64_t kRacyMarginNs = 2'000'000'000;

int64_t now_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string hex128(const XXH128_hash_t& h) { return fmt::format("{:016x}{:016x}", h.high64, h.low64); }

// What says a file is the one that was hashed: its identity and times, never its content.
json file_key(const std::string& dir, const FingerprintFile& f) {
  struct stat st {};
  if (::stat((fs::path(dir) / f.name).c_str(), &st) != 0) return nullptr;
  return {{"name", f.name},
          {"size", uint64_t(st.st_size)},
          {"inode", uint64_t(st.st_ino)},
          {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec},
          {"ctime_ns", int64_t(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec}};
}

// The cached hashes, by file name; empty when the cache is absent, unreadable or not ours.
std::map<std::string, json> read_cache(const std::string& path) {
  std::map<std::string, json> by_name;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return by_name;
  try {
    const json j = parse_json(read_small_file(path, kMaxCacheBytes, "fingerprint cache"), path);
    if (!j.is_object() || j.value("schema", 0) != kCacheSchema || !j.contains("files") ||
        !j["files"].is_array())
      return by_name;
    for (const json& e : j["files"])
      if (e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("xxh3_128") &&
          e["xxh3_128"].is_string())
        by_name[e["name"].get<std::string>()] = e;
  } catch (const Error&) {
    by_name.clear();  // a damaged cache is a cache miss
  }
  return by_name;
}

void write_cache(const std::string& path, const json& j) {
  const std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << "\n";
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;  // read-only or full: the fingerprint is simply computed again next time
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace

std::string checkpoint_fingerprint(const std::string& dir, const std::vector<FingerprintFile>& files) {
  std::vector<const FingerprintFile*> sorted;
  for (const auto& f : files) sorted.push_back(&f);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });

  const std::string cache_path = (fs::path(dir) / kFingerprintCacheName).string();
  const auto cached = read_cache(cache_path);
  json entries = json::array();
  bool hashed = false;
  XXH3_state_t* all = XXH3_createState();
  if (all == nullptr) fail("{}: out of memory hashing the checkpoint", dir);
  XXH3_128bits_reset(all);
  for (const FingerprintFile* f : sorted) {
    json key = file_key(dir, *f);
    std::string hash;
    // Not cached: a file that cannot be recognised next time, or changed too recently to trust.
    if (!key.is_null() &&
        now_ns() - std::max(key["mtime_ns"].get<int64_t>(), key["ctime_ns"].get<int64_t>()) < kRacyMarginNs)
      key = nullptr;
    const auto it = key.is_null() ? cached.end() : cached.find(f->name);
    if (it != cached.end()) {
      json stored = it->second;
      const std::string h = stored["xxh3_128"].get<std::string>();
      stored.erase("xxh3_128");
      if (stored == key && h.size() == 32 && h.find_first_not_of("0123456789abcdef") == std::string::npos)
        hash = h;
    }
    if (hash.empty()) {
      hash = hex128(XXH3_128bits(f->bytes.data(), f->bytes.size()));
      hashed = true;
    }
    XXH3_128bits_update(all, f->name.data(), f->name.size() + 1);  // the name and its NUL
    XXH3_128bits_update(all, hash.data(), hash.size());
    if (!key.is_null()) {
      key["xxh3_128"] = hash;
      entries.push_back(std::move(key));
    }
  }
  const std::string fingerprint = "xxh3-128:" + hex128(XXH3_128bits_digest(all));
  XXH3_freeState(all);
  if (hashed && !entries.empty())
    write_cache(cache_path, {{"schema", kCacheSchema},
                             {"what", "gpt-oss-parity: XXH3-128 of each safetensors file, keyed by "
                                      "size, inode, mtime and ctime; safe to delete"},
                             {"files", entries},
                             {"fingerprint", fingerprint}});
  return fingerprint;
}

}  // namespace parity
