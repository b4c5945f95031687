#!/usr/bin/env bash
# Assembles the folder run.sh reads (default build-devrun/, ignored by git): the two trees to
# compare as git archives, and xxhash, pugixml and PCRE2 (headers, shared libraries, a pkg-config file
# and a CMake config under /tmp/deps), which the GPU machine lacks. Then, with the device tool:
#   run(command="bash build-devrun/run.sh", carry=["build-devrun"])
# Usage: make_bundle.sh NEW_COMMIT OLD_COMMIT [DIR]
set -euo pipefail
new="$1" old="$2" dir="${3:-build-devrun}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$dir"
git archive "$new" | gzip >"$dir/new.tar.gz"
git archive "$old" | gzip >"$dir/old.tar.gz"
cp "$here/run.sh" "$dir/run.sh"
d="$dir/deps"
rm -rf "$d" && mkdir -p "$d/include" "$d/lib/pkgconfig" "$d/lib/cmake/pugixml"
cp /usr/include/xxhash.h /usr/include/xxh3.h /usr/include/xxh_x86dispatch.h /usr/include/pugixml.hpp \
  /usr/include/pugiconfig.hpp "$d/include/"
cp /usr/include/pcre2.h "$d/include/"
cp -L /usr/lib/x86_64-linux-gnu/libxxhash.so.0.8.1 /usr/lib/x86_64-linux-gnu/libpugixml.so.1.13 \
  /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0.11.2 "$d/lib/"
sed 's|^prefix=/usr|prefix=/tmp/deps|; s|^libdir=.*|libdir=${exec_prefix}/lib|' \
  /usr/lib/x86_64-linux-gnu/pkgconfig/libpcre2-8.pc >"$d/lib/pkgconfig/libpcre2-8.pc"
sed 's|^prefix=/usr|prefix=/tmp/deps|; s|^libdir=.*|libdir=${exec_prefix}/lib|' \
  /usr/lib/x86_64-linux-gnu/pkgconfig/libxxhash.pc >"$d/lib/pkgconfig/libxxhash.pc"
cat >"$d/lib/cmake/pugixml/pugixml-config.cmake" <<'CMAKE'
# pugixml 1.13 (Debian 12's libpugixml1v5), carried for the GPU machine, which lacks it.
if(NOT TARGET pugixml::pugixml)
  add_library(pugixml::pugixml SHARED IMPORTED)
  set_target_properties(pugixml::pugixml PROPERTIES
    IMPORTED_LOCATION /tmp/deps/lib/libpugixml.so.1.13
    IMPORTED_SONAME libpugixml.so.1
    INTERFACE_INCLUDE_DIRECTORIES /tmp/deps/include)
endif()
set(pugixml_VERSION 1.13)
set(pugixml_FOUND TRUE)
CMAKE
du -sh "$dir"
