#include "model/row_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace parity {

int RowShards::rank_of(int64_t element) const {
  for (const Range& r : ranges)
    if (element >= r.begin && element < r.end) return r.rank;
  return -1;
}

std::string RowShards::text() const {
  std::string s = fmt::format("{} {}", kind, ranks);
  for (const Range& r : ranges) s += fmt::format(" {}:{}-{}", r.rank, r.begin, r.end);
  return s;
}

namespace {

// A decimal number filling `s` exactly, in [0, limit].
std::optional<int64_t> whole_number(std::string_view s, int64_t limit) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || v < 0 || v > limit)
    return std::nullopt;
  return v;
}

}  // namespace

std::optional<RowShards> RowShards::parse(std::string_view text, int64_t elements,
                                          std::string& why) {
  std::vector<std::string_view> words;
  for (size_t at = 0; at < text.size();) {
    const size_t space = std::min(text.find(' ', at), text.size());
    if (space == at) {
      why = "two spaces in a row";
      return std::nullopt;
    }
    words.push_back(text.substr(at, space - at));
    at = space + 1;
  }
  if (words.size() < 2) {
    why = "not a kind and a number of ranks";
    return std::nullopt;
  }
  RowShards s;
  s.kind = std::string(words[0]);
  if (s.kind != "replicated" && s.kind != "ranges" && s.kind != "reduced" && s.kind != "partial") {
    why = "the kind is not replicated, ranges, reduced or partial";
    return std::nullopt;
  }
  const auto ranks = whole_number(words[1], kMaxRanks);
  if (!ranks || *ranks < 1) {
    why = fmt::format("the number of ranks is not 1 to {}", kMaxRanks);
    return std::nullopt;
  }
  s.ranks = int(*ranks);
  if (s.kind != "ranges" && words.size() > 2) {
    why = "ranges given for a stage of kind " + s.kind;
    return std::nullopt;
  }
  for (size_t i = 2; i < words.size(); ++i) {
    const std::string_view w = words[i];
    const size_t colon = w.find(':'), dash = w.find('-');
    int64_t rank = -1, begin = -1, end = -1;
    if (colon != w.npos && dash != w.npos && dash > colon) {
      rank = whole_number(w.substr(0, colon), s.ranks - 1).value_or(-1);
      begin = whole_number(w.substr(colon + 1, dash - colon - 1), elements).value_or(-1);
      end = whole_number(w.substr(dash + 1), elements).value_or(-1);
    }
    if (rank < 0 || begin < 0 || end < 0 || begin >= end) {
      why = fmt::format(
          "range {} is not rank:begin-end of a rank of the {} and elements of the "
          "row of {}",
          i - 1, s.ranks, elements);
      return std::nullopt;
    }
    for (const Range& r : s.ranges)
      if (begin < r.end && r.begin < end) {
        why = fmt::format("range {} overlaps an earlier one", i - 1);
        return std::nullopt;
      }
    s.ranges.push_back({int(rank), begin, end});
  }
  return s;
}

}  // namespace parity
