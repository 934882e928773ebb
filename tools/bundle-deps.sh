#!/usr/bin/env bash
# bundle-deps.sh - gather the libraries pagellm builds against, for a GPU host that cannot
# reach a package registry.
#
#   tools/bundle-deps.sh            (on a Debian/Ubuntu x86_64 machine with apt)
#   ... carry the tree, .deps/ included, to the GPU host, then there:
#   ./configure.py --deps-prefix .deps/root && ninja && ninja test
#
# Downloads the Debian packages (apt-get download, no root needed) into .deps/debs/ and
# unpacks them with dpkg -x into .deps/root/, then trims what the build does not use.
# What is kept decides how configure.py links each library:
#   jansson, libyaml, pcre2-8   libX.a kept            -> linked statically
#   libmicrohttpd, cmocka       runtime libX.so.N kept -> linked dynamically, rpath into
#                               .deps/root (libmicrohttpd's .a would need gnutls' static
#                               libraries; the host's libgnutls.so.30 serves the .so)
#   libcurl                     headers only           -> the host's libcurl.so.4
# Idempotent: packages already in .deps/debs are not downloaded again and .deps/root is
# unpacked afresh each run. `rm -rf .deps` starts over (e.g. for newer package versions).
set -euo pipefail
cd "$(dirname "$0")/.."

debs=.deps/debs
final=.deps/root
root=.deps/root.new # built here, renamed to $final when complete

# -dev packages, and the runtime packages whose shared library is linked from the bundle.
dev_packages=(libmicrohttpd-dev libjansson-dev libyaml-dev libpcre2-dev libcmocka-dev
    libcurl4-openssl-dev)

# The runtime package a -dev package depends on, by name prefix (Ubuntu 24.04 renamed some,
# e.g. libmicrohttpd12t64); $3 is the Debian 12 name, used when apt-cache cannot tell.
runtime_of() {
    local found
    found=$(apt-cache depends "$1" 2>/dev/null |
        awk -v p="$2" '$1 == "Depends:" && index($2, p) == 1 { print $2; exit }')
    echo "${found:-$3}"
}

for tool in apt-get apt-cache dpkg; do
    command -v "$tool" >/dev/null || {
        echo "bundle-deps.sh: $tool not found: run this on a Debian or Ubuntu machine" >&2
        exit 1
    }
done

packages=("${dev_packages[@]}"
    "$(runtime_of libmicrohttpd-dev libmicrohttpd libmicrohttpd12)"
    "$(runtime_of libcmocka-dev libcmocka libcmocka0)")

mkdir -p "$debs"
missing=()
for pkg in "${packages[@]}"; do
    compgen -G "$debs/${pkg}_*.deb" >/dev/null || missing+=("$pkg")
done
if ((${#missing[@]} > 0)); then
    echo "downloading: ${missing[*]}"
    # As root, apt downloads as the user _apt, who cannot write here (a warning, then a
    # fallback): download as the current user instead.
    if ! (cd "$debs" && apt-get download -o APT::Sandbox::User="$(id -un)" "${missing[@]}"); then
        echo "bundle-deps.sh: apt-get download failed (try \`apt-get update\` first)" >&2
        exit 1
    fi
else
    echo "all packages already in $debs"
fi

rm -rf "$root"
mkdir -p "$root"
for pkg in "${packages[@]}"; do
    versions=("$debs/${pkg}"_*.deb)
    deb=$(printf '%s\n' "${versions[@]}" | sort -V | tail -n 1) # newest if several
    echo "unpacking $(basename "$deb")"
    dpkg -x "$deb" "$root"
done

# Trim: documentation, autoconf and CMake files, the 16/32-bit and POSIX flavours of PCRE2,
# cmockery (cmocka's old name), the archives linked dynamically instead (see above), then
# the dev symlinks left pointing at runtime libraries not bundled (libcurl.so, ...).
jansson_pc=$(find "$root" -name jansson.pc -print -quit)
if [[ -z $jansson_pc ]]; then
    echo "bundle-deps.sh: no jansson.pc in $root: the packages look wrong" >&2
    exit 1
fi
lib=${jansson_pc%/pkgconfig/jansson.pc} # usr/lib/<multiarch>
rm -rf "${root:?}/usr/share" "${root:?}/usr/bin" "${lib:?}/cmake"
rm -rf "$root/usr/include/cmockery" "$root/usr/include/pcre2posix.h"
rm -f "$lib"/libpcre2-{16,32,posix}* "$lib"/pkgconfig/libpcre2-{16,32,posix}.pc
rm -f "$lib"/libcmockery* "$lib"/libmicrohttpd.a "$lib"/libcurl.a
find "$root" -xtype l -delete
find "$root" -depth -type d -empty -delete
rm -rf "$final"
mv "$root" "$final"
root=$final

echo
echo "bundle ready: $root ($(du -sh "$root" | cut -f1)), from the .deb files in $debs" \
    "($(du -sh "$debs" | cut -f1))"
# shellcheck disable=SC1091
echo "built for $(dpkg --print-architecture) from $(. /etc/os-release && echo "$PRETTY_NAME")."
echo "next: copy this tree, .deps/ included, to the GPU host and run there"
echo "    ./configure.py --deps-prefix $root && ninja && ninja test"
echo "(the host needs its own libcurl.so.4 and libgnutls.so.30, which Ubuntu 24.04 has)"
