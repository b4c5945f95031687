// A checkpoint's content fingerprint: XXH3-128 (xxHash) over every byte of every safetensors
// file, each file hashed on its own and the files combined in name order with their names, so a
// trace or golden manifest names the exact weights it was made from.
//
// Hashing 13 GB takes seconds even from the page cache, so each file's hash is cached beside the
// checkpoint in .parity-fingerprint.json, keyed by the file's name, size, inode, mtime and ctime
// (in nanoseconds; ctime cannot be set back by a tool, so a rewritten file is always rehashed).
// A file changed in the last two seconds is hashed but not cached (time stamps are coarse).
// The cache is untrusted input like any other file: read bounded, and anything unexpected in it
// means "hash again". It is written atomically when the directory is writable; a read-only
// checkpoint directory is hashed every time (nothing else changes).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace parity {

struct FingerprintFile {
  std::string name;                // file name inside the checkpoint directory
  std::span<const uint8_t> bytes;  // the whole file (the mapping the loader already holds)
};

// "xxh3-128:" followed by 32 lowercase hex digits.
std::string checkpoint_fingerprint(const std::string& dir, const std::vector<FingerprintFile>& files);

// The cache's file name inside the checkpoint directory.
inline constexpr const char* kFingerprintCacheName = ".parity-fingerprint.json";

}  // namespace parity
