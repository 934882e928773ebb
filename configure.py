#!/usr/bin/env python3
"""configure.py - detect pagellm's toolchain and libraries, then write build.ninja.

    ./configure.py [options] && ninja && ninja test

It finds a C compiler, the six libraries (through pkg-config, or through the .pc files of
a folder of unpacked Debian packages given with --deps-prefix), CUDA (nvcc plus cuBLAS,
cuBLASLt and cudart; NCCL when present) and MPI when present (tensor-parallel ranks as
processes under mpirun), then writes build.ninja at the repository root.
Everything it builds goes under build/:

    build/lib<name>.a        one static library per layer of LAYERS (its source folders)
    build/pagellm            cli/*.c linked with the libraries in layer order
    build/tests/test_<name>  one cmocka binary per tests/test_<name>.c, linked with only the
                             libraries of the layer it tests and below (TEST_LAYERS)

LAYERS, below, is the layer table: which library may call which. Link lines come from it, and
tools/check_layers.py (run by `ninja test` through tests/test_layers.sh, and by .ci/run)
checks every library's undefined symbols against it.

build.ninja reruns this script, with the same options, whenever configure.py changes or a
file is added to or removed from a source folder. Python 3 standard library only.
"""

import argparse
import functools
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCH = "sm_90"

# pkg-config module -> Debian package with its headers and .pc file.
LIBRARIES = {
    "libmicrohttpd": "libmicrohttpd-dev",
    "jansson": "libjansson-dev",
    "yaml-0.1": "libyaml-dev",
    "libpcre2-8": "libpcre2-dev",
    "libcurl": "libcurl4-openssl-dev",
}
TEST_LIBRARIES = {"cmocka": "libcmocka-dev"}
# Another package that satisfies the same need (libcurl comes in three TLS flavours).
ALTERNATIVES = {"libcurl4-openssl-dev": ["libcurl4-gnutls-dev", "libcurl4-nss-dev"]}
# Command -> Debian package that provides it.
TOOLS = {"ninja": "ninja-build", "pkg-config": "pkg-config", "ar": "binutils",
         "nm": "binutils"}
# Commands that only some tests and features need: the end-to-end suite (tests/e2e/run.sh,
# run by `ninja test`), `bench serve --sweep-rates` plots (gnuplot), the replicas test
# (tests/test_replicas.sh: docs/deploy/haproxy.cfg in front of two servers) and the fuzz
# targets' replay (tests/test_fuzz_replay.sh: clang with libFuzzer). Only --install-deps looks
# at them: without them those parts are skipped, not the build.
OPTIONAL_TOOLS = {"node": "nodejs", "npm": "npm", "curl": "curl", "gnuplot": "gnuplot-nox",
                  "mpirun": "openmpi-bin", "haproxy": "haproxy", "clang": "clang"}
# Optional libraries: pkg-config module -> Debian package. MPI (Open MPI's ompi-c, else what
# `mpicc --showme` says) runs tensor-parallel ranks as processes (`mpirun -np N pagellm ...`,
# PAGELLM_HAVE_MPI); without it the build goes on and only that mode is missing.
# --install-deps installs them.
OPTIONAL_LIBRARIES = {"ompi-c": "libopenmpi-dev"}
# Python modules only some tests need (test_jinja compares the jinja library with Python's
# jinja2, test_grammar validates generated JSON with jsonschema, else they skip those tests); as with OPTIONAL_TOOLS, only --install-deps looks at them.
OPTIONAL_PYTHON = {"jinja2": "python3-jinja2", "jsonschema": "python3-jsonschema"}
E2E_SCRIPT = "tests/e2e/run.sh"

# The layers, lowest first, as data: (library, its source folders, the libraries it may call).
# Each entry but PROGRAM is built as build/lib<library>.a; every link line is derived from this
# table (a program or test links the libraries it may call, theirs in turn, and nothing else,
# highest first), and tools/check_layers.py fails on any call from one library into another
# (an undefined symbol of one archive that another defines) that the table does not list. A
# library may call only libraries listed before it, so there are no cycles. The kernels layer
# is two libraries: kernels_cuda (kernels/cuda/*.cu, built only where nvcc is found) and above
# it kernels (kernels.c, which opens either backend by name, and the CPU backend); the
# scheduler never sees kernels or models.
LAYERS = [
    ("common", ["common"], []),
    ("kernels_cuda", ["kernels/cuda"], ["common"]),
    ("kernels", ["kernels/cpu", "kernels"], ["kernels_cuda", "common"]),
    ("tokenizer", ["tokenizer"], ["common"]),
    ("jinja", ["jinja"], ["common"]),
    ("grammar", ["grammar"], ["common"]),
    ("models", ["models"], ["kernels", "common"]),
    ("scheduler", ["scheduler"], ["common"]),
    ("engine", ["engine"], ["models", "scheduler", "kernels", "tokenizer", "grammar", "common"]),
    ("server", ["server"], ["engine", "tokenizer", "jinja", "grammar", "kernels", "common"]),
    ("bench", ["bench"], ["engine", "tokenizer", "grammar", "kernels", "common"]),
    ("cli", ["cli"], ["bench", "server", "engine", "scheduler", "models", "tokenizer", "jinja",
                      "grammar", "kernels", "common"]),
]
PROGRAM = "cli"  # built as build/pagellm (its own folder's objects + what it may call)
# Edges allowed for some symbols only (fnmatch patterns): the server and the bench take just
# the sampling defaults (include/sampling.h, kernels/kernels.c) from kernels.
NARROW_EDGES = {("server", "kernels"): ["sampling_*"], ("bench", "kernels"): ["sampling_*"]}
# The parts (source files) of a library, top to bottom: a part may call only the parts listed
# after it, so no part calls back up into one that uses it (checked with the layers).
PART_ORDER = {
    "engine": ["generate", "engine", "step", "overlap", "output", "sampler", "logit_edits",
               "request", "constraint", "runner", "runner_mpi", "rank_jobs", "runner_forward"],
}
# Libraries whose every exported symbol has one of these prefixes (checked with the layers).
EXPORT_PREFIXES = {"tokenizer": ["tok_"], "jinja": ["jinja_"], "grammar": ["gr_"]}
# Folders whose private headers stay private: tests do not get -I for them either.
SEALED_FOLDERS = ["tokenizer"]
# The libraries each test binary exercises: it links those and what they may call, nothing
# above. A tests/test_*.c missing here is linked like PROGRAM (configure.py says so).
TEST_LAYERS = {
    "test_tokenizer": ["tokenizer"],
    "test_jinja": ["jinja"],
    "test_grammar": ["grammar"],
    "test_kernels_cpu": ["kernels"],
    "test_fp8": ["kernels"],
    "test_sampling": ["kernels"],
    "test_attention_cuda": ["kernels"],
    "test_gemm_sm90a_cuda": ["kernels"],
    "test_gemv_fused_cuda": ["kernels"],
    "test_matmul_cuda": ["kernels"],
    "test_fp8_cuda": ["kernels"],
    "test_matmul_norm_cuda": ["kernels"],
    "test_sample_cuda": ["kernels"],
    "test_moe_cuda": ["kernels"],
    "test_kernels_cuda": ["models"],  # dummy weights from models/weights.c
    "test_checkpoint": ["models"],
    "test_config": ["models"],
    "test_tensor_parallel": ["models"],
    "test_families": ["models"],
    "test_fp8_models": ["models"],
    "test_block_manager": ["scheduler"],
    "test_scheduler": ["scheduler"],
    "test_engine": ["engine"],
    "test_constraint_async": ["engine"],
    "test_golden": ["engine"],
    "test_families_engine": ["engine"],
    "test_tp_cuda": ["engine"],
    "test_fp8_models_cuda": ["engine"],
    "test_api": ["server"],
    "test_chat": ["server"],
    "test_tool_parser": ["server"],
    "test_config_file": ["server"],
    "test_deadline": ["server"],
    "test_metrics": ["server"],
    "test_bench": ["bench"],
    "test_cli": ["cli"],  # runs build/pagellm
}
# Programs built beside the tests but never run by `ninja test` (benchmarks of one library):
# source -> the libraries it links (with what those may call), built as build/tools/<name>
# with the tests' includes and tests/support objects (the grammar benchmark reads vocabularies
# through tests/support/hf_vocab.c).
TOOL_PROGRAMS = {"tools/grammar_bench.c": ["grammar"]}
# Script tests that `ninja test` runs after the test binaries (each prints cmocka summaries):
# the layering check, tensor-parallel ranks as MPI processes (skipped without MPI), the
# haproxy replicas, and the fuzz targets over their corpora (skipped without clang).
SCRIPT_TESTS = ["tests/test_layers.sh", "tests/test_mpi.sh", "tests/test_replicas.sh",
                "tests/test_fuzz_replay.sh"]
SOURCE_FOLDERS = ["common", "kernels", "kernels/cpu", "kernels/cuda", "tokenizer", "jinja",
                  "grammar", "models", "scheduler", "engine", "server", "bench", "cli", "tests",
                  "tests/support"]


def layer_uses(name):
    """The libraries `name` may call (its own entry's list)."""
    for lib, _, uses in LAYERS:
        if lib == name:
            return uses
    raise KeyError(name)


def link_closure(names):
    """The libraries a program using `names` links: those, what they may call, and so on,
    in link order (highest layer first)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += layer_uses(name)
    return [lib for lib, _, _ in reversed(LAYERS) if lib in seen]


def check_layer_table():
    """The table's own rules: known names, calls only downward (no cycles)."""
    order = [lib for lib, _, _ in LAYERS]
    for i, (lib, _, uses) in enumerate(LAYERS):
        for dep in uses:
            if dep not in order[:i]:
                die("configure.py LAYERS: %s may call %s, which is not listed before it"
                    % (lib, dep))
    for user, dep in NARROW_EDGES:
        if dep not in layer_uses(user):
            die("configure.py NARROW_EDGES: %s -> %s is not in LAYERS" % (user, dep))
    for test, libs in TEST_LAYERS.items():
        for lib in libs:
            if lib not in order:
                die("configure.py TEST_LAYERS: %s names no library %s" % (test, lib))


ASAN_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
              "-fno-sanitize-recover=undefined"]

# Libraries that the C library or compiler itself provides.
LIBC_LIBS = {"c", "m", "pthread", "dl", "rt", "util"}


class ConfigureError(Exception):
    """A problem the user must fix; printed without a traceback."""


def info(msg):
    print(msg, flush=True)


def die(msg):
    raise ConfigureError(msg)


def run(cmd, env=None):
    """Run cmd; return (exit status, stdout + stderr as text)."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, universal_newlines=True)
    except OSError as err:
        return 127, str(err)
    return proc.returncode, proc.stdout


# ---------------------------------------------------------------------------------------
# Options


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="configure.py",
        description="Detect the toolchain and libraries and write build.ninja.",
        epilog="Then run `ninja` (build/pagellm and the tests) and `ninja test`.")
    parser.add_argument(
        "--cpu-only", action="store_true",
        help="build the CPU backend only, even where CUDA is found")
    parser.add_argument(
        "--cuda-arch", default=DEFAULT_ARCH, metavar="ARCH",
        help="GPU architecture for nvcc, passed as -arch=ARCH (default %(default)s, "
             "H100/H200); a bare number such as 80 means sm_80")
    parser.add_argument(
        "--debug", action="store_true",
        help="-O0 -g3 -DPAGELLM_DEBUG instead of -O2 -g")
    parser.add_argument(
        "--asan", action="store_true",
        help="AddressSanitizer and UndefinedBehaviorSanitizer (-fsanitize=address,undefined "
             "-fno-omit-frame-pointer -fno-sanitize-recover=undefined) at compile and link")
    parser.add_argument(
        "--deps-prefix", metavar="DIR",
        help="take the libraries from DIR, a folder where Debian packages were unpacked with "
             "`dpkg -x` (tools/bundle-deps.sh makes .deps/root); the system's .pc files are "
             "ignored and pkg-config is not needed; a library that DIR holds as libX.a is "
             "linked statically, the others dynamically with an rpath")
    parser.add_argument(
        "--install-deps", action="store_true",
        help="first install the missing Debian packages (libraries, ninja, pkg-config, gcc) "
             "with apt-get, through sudo when not root")
    parser.add_argument(
        "--without-mpi", action="store_true",
        help="build without MPI even where it is found (no `mpirun -np N` tensor parallelism)")
    parser.add_argument(
        "--cc", metavar="CC",
        help="C compiler (default: $CC, else gcc, else clang)")
    args = parser.parse_args(argv)
    if args.cuda_arch.isdigit():
        args.cuda_arch = "sm_" + args.cuda_arch
    if args.deps_prefix:
        args.deps_prefix = os.path.abspath(args.deps_prefix)
    return args


def regen_args(args, cc):
    """The options build.ninja reruns configure.py with: this run's, minus --install-deps
    (regenerating must not call apt-get), with a compiler taken from $CC pinned."""
    out = []
    if args.cpu_only:
        out.append("--cpu-only")
    if args.cuda_arch != DEFAULT_ARCH:
        out.append("--cuda-arch=" + args.cuda_arch)
    if args.debug:
        out.append("--debug")
    if args.asan:
        out.append("--asan")
    if args.without_mpi:
        out.append("--without-mpi")
    if args.deps_prefix:
        rel = os.path.relpath(args.deps_prefix, ROOT)
        out.append("--deps-prefix=" + (args.deps_prefix if rel.startswith("..") else rel))
    if args.cc or os.environ.get("CC"):
        out.append("--cc=" + cc)
    return out


# ---------------------------------------------------------------------------------------
# Compiler and tools


def cc_candidates(requested):
    if requested:
        return [requested], "--cc"
    if os.environ.get("CC"):
        return [os.environ["CC"]], "$CC"
    return ["gcc", "clang"], None


def find_cc(requested):
    """The C compiler command, or None when none is found."""
    names, source = cc_candidates(requested)
    for name in names:
        words = shlex.split(name)
        if words and shutil.which(words[0]):
            return name
    if source:
        die("C compiler %r (from %s) not found" % (names[0], source))
    return None


def cc_version(cc):
    status, out = run(shlex.split(cc) + ["--version"])
    return out.splitlines()[0].strip() if status == 0 and out else "unknown version"


def check_tools(need_pkg_config):
    missing = [tool for tool in TOOLS
               if not shutil.which(tool) and (tool != "pkg-config" or need_pkg_config)]
    if missing:
        die("missing tools:\n" + "".join(
            "  %-12s Debian package %s\n" % (t, TOOLS[t]) for t in missing)
            + "hint: run `./configure.py --install-deps`")


@functools.lru_cache(maxsize=None)
def system_lib_dirs(cc):
    """Folders the compiler's linker searches, from `cc -print-search-dirs`."""
    status, out = run(shlex.split(cc) + ["-print-search-dirs"])
    dirs = []
    for line in out.splitlines() if status == 0 else []:
        if line.startswith("libraries:"):
            dirs = line.split("=", 1)[-1].split(":")
    dirs += ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
    seen, out_dirs = set(), []
    for d in dirs:
        d = os.path.realpath(d) if d else ""
        if d and d not in seen and os.path.isdir(d) and "/stubs" not in d:
            seen.add(d)
            out_dirs.append(d)
    return out_dirs


# ---------------------------------------------------------------------------------------
# --install-deps


def dpkg_installed(package):
    status, out = run(["dpkg-query", "-W", "-f=${Status}", package])
    return status == 0 and out.strip().endswith(" installed")


def missing_packages(have_cc):
    missing = [TOOLS[t] for t in TOOLS if not shutil.which(t)]
    missing += [OPTIONAL_TOOLS[t] for t in OPTIONAL_TOOLS if not shutil.which(t)]
    missing += [OPTIONAL_PYTHON[m] for m in OPTIONAL_PYTHON
                if not importlib.util.find_spec(m) and not dpkg_installed(OPTIONAL_PYTHON[m])]
    if not have_cc:
        missing.append("gcc")
    wanted = (list(LIBRARIES.values()) + list(TEST_LIBRARIES.values())
              + list(OPTIONAL_LIBRARIES.values()) + ["libc6-dev"])
    for package in wanted:
        choices = [package] + ALTERNATIVES.get(package, [])
        if not any(dpkg_installed(p) for p in choices):
            missing.append(package)
    return missing


def apt_command():
    """The command prefix that runs apt-get as root."""
    apt = shutil.which("apt-get")
    if not apt or not shutil.which("dpkg-query"):
        die("--install-deps needs apt-get and dpkg-query (a Debian or Ubuntu system); "
            "install these packages by hand: " + " ".join(missing_packages(True)))
    if os.geteuid() == 0:
        return [apt]
    if shutil.which("sudo"):
        return ["sudo", "env", "DEBIAN_FRONTEND=noninteractive", apt]
    die("--install-deps must run as root (and sudo is not installed)")


def install_deps(have_cc):
    if not shutil.which("dpkg-query"):
        apt_command()  # dies with the explanation
    missing = missing_packages(have_cc)
    if not missing:
        info("all dependencies present")
        return
    info("installing: " + " ".join(missing))
    apt = apt_command()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (apt + ["update"], apt + ["install", "-y", "--no-install-recommends"] + missing):
        info("+ " + " ".join(cmd))
        if subprocess.call(cmd, env=env) != 0:
            die("`%s` failed" % " ".join(cmd))


# ---------------------------------------------------------------------------------------
# Libraries through pkg-config


def pkg_config(args, env=None):
    status, out = run(["pkg-config"] + args, env=env)
    if status != 0:
        die("pkg-config %s failed:\n%s" % (" ".join(args), out))
    return shlex.split(out)


def missing_library_error(modules, packages, where, hint):
    lines = ["missing libraries (%s):" % where]
    for module in modules:
        lines.append("  %-14s Debian package %s" % (module, packages[module]))
    die("\n".join(lines + ["hint: " + hint]))


class SystemLibs:
    """The libraries as the system's pkg-config sees them."""

    def __init__(self):
        self.packages = dict(LIBRARIES, **TEST_LIBRARIES)
        missing = [m for m in self.packages if run(["pkg-config", "--exists", m])[0] != 0]
        if missing:
            missing_library_error(
                missing, self.packages, "not found by pkg-config",
                "run `./configure.py --install-deps`, or on a machine without package "
                "access build with --deps-prefix (see tools/bundle-deps.sh)")
        self.rpath = []

    def cflags(self, modules):
        return pkg_config(["--cflags"] + modules)

    def libs(self, modules):
        return pkg_config(["--libs"] + modules)

    def describe(self, modules):
        return ", ".join("%s %s" % (m, " ".join(pkg_config(["--modversion", m])))
                         for m in modules)


# ---------------------------------------------------------------------------------------
# Libraries from --deps-prefix DIR (own .pc reader: the GPU host may lack pkg-config)


def pc_expand(value, variables):
    for _ in range(20):
        new = re.sub(r"\$\{([A-Za-z0-9_.]+)\}", lambda m: variables.get(m.group(1), ""), value)
        if new == value:
            break
        value = new
    return value


def pc_parse(path):
    """A .pc file's fields (Cflags, Libs, Requires ...) with variables expanded."""
    variables = {"pcfiledir": os.path.dirname(path)}
    fields = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            m = re.match(r"^([A-Za-z0-9_.]+)\s*([:=])\s*(.*)$", line)
            if not m:
                continue
            name, kind, value = m.groups()
            if kind == "=":
                variables[name] = pc_expand(value, variables)
            else:
                fields[name] = pc_expand(value, variables)
    return fields


def pc_modules(requires):
    """Module names of a Requires field ("gnutls >= 3.0, zlib" -> [gnutls, zlib])."""
    names, skip = [], False
    for word in re.split(r"[\s,]+", requires.strip()):
        if not word:
            continue
        if word in ("<", ">", "=", "<=", ">=", "!="):
            skip = True
        elif skip:
            skip = False
        else:
            names.append(word)
    return names


class PrefixLibs:
    """The libraries from DIR, where Debian packages were unpacked with `dpkg -x`.

    -I and -L paths of the .pc files are moved into DIR (as PKG_CONFIG_SYSROOT_DIR would).
    Per library: static when DIR holds libX.a and everything it needs privately can be
    found; else shared from DIR (-L, -l and an rpath); else the system's shared library
    (its dev symlink, or the runtime libX.so.N by full path: the GPU host has runtimes of
    some libraries but no -dev packages)."""

    def __init__(self, prefix, cc):
        if not os.path.isdir(prefix):
            die("--deps-prefix %s: no such folder (make it with tools/bundle-deps.sh)" % prefix)
        self.prefix = prefix
        self.system_dirs = system_lib_dirs(cc)
        self.pc_dirs = [d for pattern in ("usr/lib/*/pkgconfig", "usr/lib/pkgconfig",
                                          "usr/lib64/pkgconfig", "usr/share/pkgconfig",
                                          "usr/local/lib/pkgconfig", "lib/*/pkgconfig")
                        for d in sorted(glob.glob(os.path.join(prefix, pattern)))]
        self.cache = {}
        self.rpath = []
        self.how = {}
        self.packages = dict(LIBRARIES, **TEST_LIBRARIES)
        missing = [m for m in self.packages if not self.find_pc(m)]
        if missing:
            missing_library_error(
                missing, self.packages, "no .pc file under %s" % prefix,
                "make the bundle again with tools/bundle-deps.sh on a machine with apt")

    def find_pc(self, module):
        for d in self.pc_dirs:
            path = os.path.join(d, module + ".pc")
            if os.path.isfile(path):
                return path
        return None

    def load(self, module):
        if module not in self.cache:
            path = self.find_pc(module)
            if not path:
                die("%s is needed but has no %s.pc under %s" % (module, module, self.prefix))
            self.cache[module] = pc_parse(path)
        return self.cache[module]

    def field(self, module, name):
        """A .pc field split into words, with -I/-L paths moved into DIR."""
        words = shlex.split(self.load(module).get(name, ""))
        return [w[:2] + self.prefix + w[2:] if w[:3] in ("-I/", "-L/") else w for w in words]

    def cflags(self, modules):
        flags = []
        for module in modules:
            for req in pc_modules(self.load(module).get("Requires", "")):
                flags += self.cflags([req])
            for req in pc_modules(self.load(module).get("Requires.private", "")):
                if self.find_pc(req):
                    flags += self.cflags([req])
            flags += self.field(module, "Cflags")
        return dedup(flags)

    def libs(self, modules):
        """Link words: every -L first, then archives and -l in dependency order."""
        words = []
        for module in modules:
            words += self.module_libs(module)
        dirs = [w for w in words if w.startswith("-L")]
        rest = [w for w in words if not w.startswith("-L")]
        return dedup(dirs) + dedup(rest, keep_last=True)

    def module_libs(self, module):
        libs = self.field(module, "Libs")
        dirs = [w[2:] for w in libs if w.startswith("-L")]
        names = [w[2:] for w in libs if w.startswith("-l")]
        other = [w for w in libs if not w.startswith(("-L", "-l"))]
        words = self.static_libs(module, dirs, names)
        if words is None:
            words = [w for name in names for w in self.shared_lib(module, name, dirs)]
        for req in pc_modules(self.load(module).get("Requires", "")):
            words += self.module_libs(req)
        return words + other

    def in_prefix(self, dirs, filename):
        for d in dirs:
            path = os.path.join(d, filename)
            if d.startswith(self.prefix) and os.path.exists(path):
                return path
        return None

    def static_libs(self, module, dirs, names):
        """Archive paths plus private dependencies, or None when static linking is not
        possible from what DIR and the system hold."""
        archives = [self.in_prefix(dirs, "lib%s.a" % n) for n in names]
        if not names or None in archives:
            return None
        private = []
        for req in pc_modules(self.load(module).get("Requires.private", "")):
            if not self.find_pc(req):
                return None
            private += self.module_libs(req)
        priv = self.field(module, "Libs.private")
        priv_dirs = dirs + [w[2:] for w in priv if w.startswith("-L")]
        for word in priv:
            if word.startswith("-l"):
                resolved = self.private_lib(word[2:], priv_dirs)
                if resolved is None:
                    return None
                private += resolved
            elif not word.startswith("-L"):
                private.append(word)
        self.how[module] = "static"
        return archives + private

    def private_lib(self, name, dirs):
        """Link words for a private dependency of a static library, or None."""
        if name in LIBC_LIBS:
            return ["-l" + name]
        archive = self.in_prefix(dirs, "lib%s.a" % name)
        if archive:
            return [archive]
        if self.in_prefix(dirs, "lib%s.so" % name):
            return self.shared_from_prefix(name, dirs)
        if self.system_file("lib%s.so" % name) or self.system_file("lib%s.a" % name):
            return ["-l" + name]
        return None

    def shared_from_prefix(self, name, dirs):
        path = self.in_prefix(dirs, "lib%s.so" % name)
        folder = os.path.dirname(path)
        if folder not in self.rpath:
            self.rpath.append(folder)
        return ["-L" + folder, "-l" + name]

    def shared_lib(self, module, name, dirs):
        if self.in_prefix(dirs, "lib%s.so" % name):
            self.how[module] = "shared, from the prefix"
            return self.shared_from_prefix(name, dirs)
        path = self.system_file("lib%s.so" % name) or self.system_runtime(name)
        if not path:
            die("%s: lib%s is neither in %s (as .a or .so) nor on this system"
                % (module, name, self.prefix))
        self.how[module] = "shared, system " + path
        return [path]

    def system_file(self, filename):
        for d in self.system_dirs:
            path = os.path.join(d, filename)
            if os.path.exists(path):
                return path
        return None

    def system_runtime(self, name):
        """The runtime libX.so.N (shortest name, e.g. libcurl.so.4) in the system folders."""
        for d in self.system_dirs:
            found = glob.glob(os.path.join(d, "lib%s.so.[0-9]*" % name))
            if found:
                return min(found, key=len)
        return None

    def describe(self, modules):
        return ", ".join("%s %s (%s)" % (m, self.load(m).get("Version", "?"),
                                         self.how.get(m, "?")) for m in modules)


def dedup(words, keep_last=False):
    """Drop repeated words, keeping the first occurrence, or with keep_last the last one
    (on a link line a library must come after everything that uses it)."""
    seq = list(reversed(words)) if keep_last else words
    seen, out = set(), []
    for w in seq:
        if w not in seen:
            seen.add(w)
            out.append(w)
    return list(reversed(out)) if keep_last else out


# ---------------------------------------------------------------------------------------
# CUDA


class Cuda:
    """What was found of the CUDA toolkit; `on` says whether the CUDA backend is built."""

    def __init__(self, on, why, nvcc=None, include=(), lib_dirs=(), nccl=False):
        self.on, self.why, self.nvcc = on, why, nvcc
        self.include, self.lib_dirs, self.nccl = list(include), list(lib_dirs), nccl


def find_nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        path = os.path.join(root, "bin", "nvcc") if root else ""
        if path and os.access(path, os.X_OK):
            return path
    return None


def find_in(dirs, filename):
    for d in dirs:
        if os.path.exists(os.path.join(d, filename)):
            return d
    return None


def nvcc_version(nvcc):
    status, out = run([nvcc, "--version"])
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if status == 0 and m else "unknown version"


def detect_cuda(args, cc):
    if args.cpu_only:
        return Cuda(False, "--cpu-only")
    nvcc = find_nvcc()
    if not nvcc:
        return Cuda(False, "nvcc not found in PATH or /usr/local/cuda/bin")
    root = os.path.dirname(os.path.dirname(os.path.abspath(nvcc)))
    lib_dirs = [os.path.join(root, d) for d in ("lib64", "targets/x86_64-linux/lib", "lib")]
    lib_dirs = [d for d in lib_dirs if os.path.isdir(d)] + system_lib_dirs(cc)
    inc_dirs = [os.path.join(root, d) for d in ("include", "targets/x86_64-linux/include")]
    inc_dirs += ["/usr/include", "/usr/local/include"]
    version = "nvcc %s" % nvcc_version(nvcc)
    for lib in ("cublasLt", "cublas", "cudart"):
        if not find_in(lib_dirs, "lib%s.so" % lib):
            return Cuda(False, "%s found, but not lib%s.so (cuBLAS, cuBLASLt and cudart are "
                               "needed) in %s" % (version, lib, " ".join(lib_dirs[:2])))
    include = [find_in(inc_dirs, "cuda_runtime.h")]
    if not include[0]:
        return Cuda(False, "%s found, but not cuda_runtime.h" % version)
    nccl_inc, nccl_lib = find_in(inc_dirs, "nccl.h"), find_in(lib_dirs, "libnccl.so")
    libs = [find_in(lib_dirs, "libcublasLt.so"), find_in(lib_dirs, "libcudart.so")]
    if nccl_inc and nccl_lib:
        include.append(nccl_inc)
        libs.append(nccl_lib)
        nccl = "NCCL yes"
    else:
        nccl = "NCCL no: %s not found" % ("nccl.h" if not nccl_inc else "libnccl.so")
    why = "%s, %s, %s" % (version, args.cuda_arch, nccl)
    system = set(system_lib_dirs(cc))  # searched anyway; an -L to one would shadow DIR
    libs = [d for d in dedup(libs) if os.path.realpath(d) not in system]
    return Cuda(True, why, nvcc, dedup(include), libs, bool(nccl_inc and nccl_lib))


def detect_mpi(args):
    """(C flags, link words, why) for MPI: pkg-config's ompi-c, else `mpicc --showme`; empty
    flags when it is not found or --without-mpi."""
    hint = "install libopenmpi-dev (or ./configure.py --install-deps)"
    if args.without_mpi:
        return [], [], "off: --without-mpi"
    if shutil.which("pkg-config") and run(["pkg-config", "--exists", "ompi-c"])[0] == 0:
        version = " ".join(pkg_config(["--modversion", "ompi-c"]))
        return (["-DPAGELLM_HAVE_MPI=1"] + pkg_config(["--cflags", "ompi-c"]),
                pkg_config(["--libs", "ompi-c"]), "Open MPI %s (pkg-config ompi-c)" % version)
    if shutil.which("mpicc"):
        s1, comp = run(["mpicc", "--showme:compile"])
        s2, link = run(["mpicc", "--showme:link"])
        if s1 == 0 and s2 == 0:
            return (["-DPAGELLM_HAVE_MPI=1"] + shlex.split(comp), shlex.split(link),
                    "mpicc --showme")
    return [], [], "off: not found (%s)" % hint


def cuda_flags(cuda, args):
    """(C flags, nvcc flags, link words) for the CUDA backend."""
    if not cuda.on:
        return [], [], []
    defines = ["-DPAGELLM_HAVE_CUDA=1"] + (["-DPAGELLM_HAVE_NCCL=1"] if cuda.nccl else [])
    includes = ["-I" + d for d in cuda.include if d not in ("/usr/include",)]
    nvccflags = ["-O3", "-arch=" + args.cuda_arch, "-std=c++17", "-lineinfo", "-Iinclude"]
    if args.debug:
        nvccflags += ["-g", "-DPAGELLM_DEBUG"]
    link = ["-L" + d for d in cuda.lib_dirs] + ["-Wl,-rpath," + d for d in cuda.lib_dirs]
    link += ["-lcublasLt", "-lcublas", "-lcudart"] + (["-lnccl"] if cuda.nccl else [])
    link += ["-lstdc++"]
    return defines + includes, nvccflags + defines + includes, link


def sm90a_flags(nvccflags, args):
    """nvcc flags for the *_sm90a.cu files: their wgmma kernels need the sm_90a target, which runs
    on compute capability 9.0 only; they define PAGELLM_SM90A so the host code knows. For any other
    --cuda-arch they compile as the rest, without those kernels."""
    if args.cuda_arch not in ("sm_90", "sm_90a"):
        return nvccflags
    return ["-gencode=arch=compute_90a,code=sm_90a" if f.startswith("-arch=") else f
            for f in nvccflags] + ["-DPAGELLM_SM90A=1"]


# ---------------------------------------------------------------------------------------
# Sources


def sources(folders, ext):
    return [p for f in folders for p in sorted(glob.glob(os.path.join(f, "*" + ext)))]


def object_path(src):
    return "build/obj/" + os.path.splitext(src)[0] + ".o"


def library_plan(cuda):
    """[(library name, sources)] in LAYERS order, lowest first; libraries without sources
    (kernels_cuda without nvcc) left out."""
    plan = []
    for name, folders, _ in LAYERS:
        srcs = sources(folders, ".c") + (sources(folders, ".cu") if cuda.on else [])
        if srcs and name != PROGRAM:
            plan.append((name, srcs))
    return plan


# ---------------------------------------------------------------------------------------
# build.ninja


def esc_path(path):
    """A path as ninja reads it in a build line."""
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def esc_words(words):
    """Shell words as one ninja variable value."""
    return " ".join(shlex.quote(w) for w in words).replace("$", "$$")


class NinjaWriter:
    def __init__(self):
        self.lines = []

    def comment(self, text):
        self.lines += ["# " + line if line else "#" for line in text.splitlines()]

    def newline(self):
        self.lines.append("")

    def variable(self, name, value, indent=0):
        self.lines.append("%s%s = %s" % ("  " * indent, name, value))

    def rule(self, name, **keys):
        self.lines.append("rule " + name)
        for key, value in keys.items():
            self.variable(key, value, 1)
        self.newline()

    def build(self, outputs, rule, inputs=(), implicit=(), variables=None):
        line = "build %s: %s" % (" ".join(map(esc_path, outputs)), rule)
        line += "".join(" " + esc_path(p) for p in inputs)
        if implicit:
            line += " |" + "".join(" " + esc_path(p) for p in implicit)
        self.lines.append(line)
        for key, value in (variables or {}).items():
            self.variable(key, value, 1)

    def text(self):
        return "\n".join(self.lines) + "\n"


RULES = {
    "cc": dict(command="$cc -MMD -MF $out.d $cflags $includes -c $in -o $out",
               depfile="$out.d", deps="gcc", description="CC $out"),
    "nvcc": dict(command="$nvcc -MD -MF $out.d $nvccflags $includes -c $in -o $out",
                 depfile="$out.d", deps="gcc", description="NVCC $out"),
    "ar": dict(command="rm -f $out && $ar crs $out $in", description="AR $out"),
    "link": dict(command="$cc $ldflags -o $out $in $libs", description="LINK $out"),
    "test": dict(command="tests/run_tests.sh $in", pool="console",
                 description="TEST (tests/run_tests.sh)"),
}


def compile_edges(w, srcs, folders):
    """Compile srcs with -I for each of folders (where private headers live)."""
    objs = []
    includes = esc_words(["-I" + f for f in folders])
    for src in srcs:
        rule = "nvcc" if src.endswith(".cu") else "cc"
        obj = object_path(src)
        variables = {"includes": includes}
        if src.endswith("_sm90a.cu"):
            variables["nvccflags"] = "$nvccflags_sm90a"
        w.build([obj], rule, [src], variables=variables)
        objs.append(obj)
    return objs


def write_variables(w, cfg):
    w.variable("ninja_required_version", "1.5")
    w.variable("builddir", "build")
    w.variable("cc", cfg["cc"])
    w.variable("ar", "ar")
    w.variable("cflags", esc_words(cfg["cflags"]))
    w.variable("ldflags", esc_words(cfg["ldflags"]))
    w.variable("libs", esc_words(cfg["libs"]))
    w.variable("test_libs", esc_words(cfg["test_libs"]))
    if cfg["nvcc"]:
        w.variable("nvcc", cfg["nvcc"])
        w.variable("nvccflags", esc_words(cfg["nvccflags"]))
        w.variable("nvccflags_sm90a", esc_words(cfg["nvccflags_sm90a"]))
    w.newline()


def write_rules(w, cfg):
    rules = dict(RULES)
    rules["configure"] = dict(
        command=esc_words(["python3", "configure.py"] + cfg["regen"]),
        generator="1", description="CONFIGURE build.ninja")
    for name, keys in rules.items():
        if name != "nvcc" or cfg["nvcc"]:
            w.rule(name, **keys)


def write_libraries(w, plan):
    """One archive per library; returns {library name: archive path}."""
    archives = {}
    for name, srcs in plan:
        w.comment("lib%s.a (may call: %s)" % (name, ", ".join(layer_uses(name)) or "nothing"))
        folder = srcs[0].split("/")[0]
        objs = compile_edges(w, srcs, [folder])
        archive = "build/lib%s.a" % name
        w.build([archive], "ar", objs)
        w.newline()
        archives[name] = archive
    return archives


def link_archives(archives, names):
    """The archives a program using the libraries `names` links, in link order."""
    return [archives[lib] for lib in link_closure(names) if lib in archives]


def write_programs(w, archives, plan, tools):
    """build/pagellm, the test binaries and TOOL_PROGRAMS (appended to tools); returns
    (pagellm or None, tests). Each links only
    the libraries of its layer and below (LAYERS, TEST_LAYERS). Tests may include the private
    headers of every folder but SEALED_FOLDERS (white-box unit tests)."""
    pagellm = None
    cli = sources([PROGRAM], ".c")
    if cli:
        w.comment("build/pagellm")
        objs = compile_edges(w, cli, [PROGRAM])
        pagellm = "build/pagellm"
        w.build([pagellm], "link", objs + link_archives(archives, [PROGRAM]))
        w.newline()
    folders = dedup([srcs[0].split("/")[0] for _, srcs in plan])
    test_includes = ["tests"] + [f for f in folders if f not in SEALED_FOLDERS]
    support = compile_edges(w, sources(["tests/support"], ".c"), test_includes)
    tests = []
    for src in sorted(glob.glob("tests/test_*.c")):
        name = os.path.splitext(os.path.basename(src))[0]
        if name not in TEST_LAYERS:
            info("note: %s is not in configure.py's TEST_LAYERS: linked with every library"
                 % src)
        obj = compile_edges(w, [src], test_includes)
        binary = "build/tests/" + name
        w.build([binary], "link",
                obj + support + link_archives(archives, TEST_LAYERS.get(name, [PROGRAM])),
                variables={"libs": "$test_libs"})
        tests.append(binary)
    for src, libs in TOOL_PROGRAMS.items():
        if os.path.isfile(src):
            binary = "build/tools/" + os.path.splitext(os.path.basename(src))[0]
            w.build([binary], "link", compile_edges(w, [src], test_includes)
                    + support + link_archives(archives, libs))
            tools.append(binary)
    return pagellm, tests


def watched_folders():
    """The source folders, or for one that does not exist yet the closest folder above it
    that does: creating a file or folder there changes that folder's mtime."""
    folders = []
    for folder in SOURCE_FOLDERS:
        while not os.path.isdir(folder):
            folder = os.path.dirname(folder) or "."
        folders.append(folder)
    return dedup(folders)


def write_ninja(cfg, plan):
    w = NinjaWriter()
    w.comment("build.ninja - generated by `%s`; edit configure.py, not this file.\n"
              "ninja builds build/pagellm and the tests; `ninja test` runs the tests."
              % " ".join(["./configure.py"] + cfg["regen"]))
    w.newline()
    write_variables(w, cfg)
    write_rules(w, cfg)
    archives = write_libraries(w, plan)
    tools = []
    pagellm, tests = write_programs(w, archives, plan, tools)
    w.newline()
    w.comment("`ninja test`: every test binary, the script tests (tests/test_layers.sh: the "
              "layering check), then the end-to-end suite, through tests/run_tests.sh")
    scripts = [t for t in SCRIPT_TESTS if os.path.isfile(t)]
    e2e = [E2E_SCRIPT] if pagellm and os.path.isfile(E2E_SCRIPT) else []
    w.build(["test"], "test", tests + scripts + e2e,
            implicit=([pagellm] if pagellm else []) + list(archives.values()))
    w.newline()
    w.comment("Regenerate when configure.py changes or a source folder gains or loses a file.")
    w.build(["build.ninja"], "configure", implicit=["configure.py"] + watched_folders())
    w.newline()
    w.lines.append("default " + " ".join(map(esc_path, ([pagellm] if pagellm else [])
                                             + tests + tools + list(archives.values()))))
    # build/ first: ninja would create it, changing the mtime of the folder "." (watched
    # while a source folder is missing) after build.ninja's, and so regenerate once more.
    os.makedirs("build", exist_ok=True)
    with open("build.ninja", "w") as f:
        f.write(w.text())
    return pagellm, tests


# ---------------------------------------------------------------------------------------
# Probe: can these flags build and start a program using every library?

PROBE = r"""
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdio.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <yaml.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

int main(void) {
    char pcre[64] = "";
    json_t *j = json_object();
    pcre2_config(PCRE2_CONFIG_VERSION, pcre);
    cmocka_set_message_output(CM_OUTPUT_STDOUT);
    printf("%s | %s | %s | %s\n", MHD_get_version(), yaml_get_version_string(), pcre,
           curl_version());
    json_decref(j);
    return 0;
}
"""


def probe(cfg):
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(PROBE)
        cmd = (shlex.split(cfg["cc"]) + cfg["cflags"] + [src, "-o", exe] + cfg["ldflags"]
               + cfg["test_libs"])
        status, out = run(cmd)
        if status != 0:
            die("cannot build a program with these flags and libraries:\n  %s\n%s"
                % (" ".join(map(shlex.quote, cmd)), out[-3000:]))
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        status, out = run([exe], env=env)
        if status != 0:
            die("a program linked with these libraries does not start:\n%s" % out[-3000:])


# ---------------------------------------------------------------------------------------
# Main


def compile_flags(args, libs, cuda_cflags):
    opt = ["-O0", "-g3", "-DPAGELLM_DEBUG"] if args.debug else ["-O2", "-g"]
    asan = ASAN_FLAGS if args.asan else []
    modules = list(LIBRARIES) + list(TEST_LIBRARIES)
    return (["-std=c11", "-D_GNU_SOURCE"] + opt
            + ["-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread", "-Iinclude"]
            + asan + cuda_cflags + libs.cflags(modules))


def configure(args):
    if args.install_deps:
        install_deps(find_cc(args.cc) is not None)
    cc = find_cc(args.cc)
    if not cc:
        die("no C compiler found (tried gcc, clang); Debian package gcc\n"
            "hint: run `./configure.py --install-deps`")
    check_tools(need_pkg_config=not args.deps_prefix)
    libs = PrefixLibs(args.deps_prefix, cc) if args.deps_prefix else SystemLibs()
    cuda = detect_cuda(args, cc)
    cuda_cflags, nvccflags, cuda_link = cuda_flags(cuda, args)
    mpi_cflags, mpi_link, mpi_why = detect_mpi(args)
    link = libs.libs(list(LIBRARIES))
    test_link = libs.libs(list(LIBRARIES) + list(TEST_LIBRARIES))
    cfg = {
        "cc": cc,
        "cflags": compile_flags(args, libs, cuda_cflags) + mpi_cflags,
        "ldflags": (["-pthread", "-Wl,--as-needed"] + (ASAN_FLAGS if args.asan else [])
                    + ["-Wl,-rpath," + d for d in libs.rpath]),
        "libs": link + cuda_link + mpi_link + ["-lm"],
        "test_libs": test_link + cuda_link + mpi_link + ["-lm"],
        "nvcc": cuda.nvcc if cuda.on else None,
        "nvccflags": nvccflags,
        "nvccflags_sm90a": sm90a_flags(nvccflags, args),
        "regen": regen_args(args, cc),
    }
    info("C compiler: %s: %s" % (cc, cc_version(cc)))
    where = " from " + args.deps_prefix if args.deps_prefix else ""
    info("libraries%s: %s" % (where, libs.describe(list(LIBRARIES) + list(TEST_LIBRARIES))))
    info("CUDA: %s (%s)" % ("on" if cuda.on else "off", cuda.why))
    info("MPI: %s" % mpi_why)
    probe(cfg)
    check_layer_table()
    plan = library_plan(cuda)
    pagellm, tests = write_ninja(cfg, plan)
    mode = ("debug" if args.debug else "release") + (" + asan" if args.asan else "")
    info("wrote build.ninja (%s): %d libraries, %s, %d test(s); now run ninja"
         % (mode, len(plan), pagellm or "no build/pagellm (cli/ has no .c)", len(tests)))


def main(argv):
    args = parse_args(argv)
    os.chdir(ROOT)
    try:
        configure(args)
    except ConfigureError as err:
        sys.stderr.write("configure.py: error: %s\n" % err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
