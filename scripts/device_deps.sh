#!/usr/bin/env bash
# The libraries the GPU machine lacks (xxHash, pugixml, PCRE2: headers, shared libraries, a
# pkg-config file each and pugixml's CMake config), copied from this machine's Debian packages
# into a folder (default build-devdeps/, ignored by git) to copy to the GPU machine beside the
# working tree. scripts/device_check.sh uses it when it is there: run scripts/device_deps.sh
# here, copy the tree with the folder, then scripts/device_check.sh there. On the GPU machine the
# folder is used where it lies (the paths inside are made relative to it there, by
# device_check.sh).
# Usage: scripts/device_deps.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
d="${1:-build-devdeps}"
lib=/usr/lib/x86_64-linux-gnu
rm -rf "$d" && mkdir -p "$d/include" "$d/lib/pkgconfig" "$d/lib/cmake/pugixml"
cp /usr/include/xxhash.h /usr/include/xxh3.h /usr/include/xxh_x86dispatch.h /usr/include/pugixml.hpp \
  /usr/include/pugiconfig.hpp /usr/include/pcre2.h "$d/include/"
cp -L "$lib/libxxhash.so.0.8.1" "$lib/libpugixml.so.1.13" "$lib/libpcre2-8.so.0.11.2" "$d/lib/"
# @PREFIX@ is replaced by the folder's absolute path where it is used.
for pc in libxxhash libpcre2-8; do
  sed 's|^prefix=/usr|prefix=@PREFIX@|; s|^libdir=.*|libdir=${exec_prefix}/lib|' \
    "$lib/pkgconfig/$pc.pc" >"$d/lib/pkgconfig/$pc.pc"
done
cat >"$d/lib/cmake/pugixml/pugixml-config.cmake" <<'CMAKE'
# pugixml 1.13 (Debian 12's libpugixml1v5), carried for the GPU machine, which lacks it.
get_filename_component(_parity_deps "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET pugixml::pugixml)
  add_library(pugixml::pugixml SHARED IMPORTED)
  set_target_properties(pugixml::pugixml PROPERTIES
    IMPORTED_LOCATION ${_parity_deps}/lib/libpugixml.so.1.13
    IMPORTED_SONAME libpugixml.so.1
    INTERFACE_INCLUDE_DIRECTORIES ${_parity_deps}/include)
endif()
set(pugixml_VERSION 1.13)
set(pugixml_FOUND TRUE)
CMAKE
du -sh "$d"
