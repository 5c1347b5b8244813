#!/usr/bin/env bash
# Configures and builds flashq with CMake + Ninja. Incremental: rerunning only
# rebuilds what changed.
#
#   scripts/build.sh                       # everything, into build/
#   BUILD_DIR=build-ci scripts/build.sh    # another build folder
#   FLASHQ_CUDA_ARCHS=90a-real ...         # CUDA architectures (default: 80-real 89-real 90a-real)
#   FLASHQ_CUDA=OFF ...                    # CPU only, even where nvcc exists
#   FLASHQ_BUILD_TYPE=Debug ...            # default Release
#   FLASHQ_JOBS=2 ...                      # parallel jobs (default: number of cores)
#   FLASHQ_BUILD_PROGRESS=1 ...            # one progress line per step with the time left;
#                                          # compiler warnings go to BUILD_DIR/build-output.log
#   FLASHQ_BUILD_DRY_RUN=1 ...             # print the cmake commands, run nothing
#   scripts/build.sh -- --target flashq-server   # extra arguments go to `cmake --build`
#
# The CMake cache keeps what a folder was configured with: a folder once configured with
# FLASHQ_CUDA_ARCHS or FLASHQ_CUDA=OFF keeps that until they are given again.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${FLASHQ_JOBS:-$(nproc)}"
DRY_RUN="${FLASHQ_BUILD_DRY_RUN:-0}"

args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${FLASHQ_BUILD_TYPE:-Release}")
[ -n "${FLASHQ_CUDA_ARCHS:-}" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=${FLASHQ_CUDA_ARCHS// /;}")
[ -n "${FLASHQ_CUDA:-}" ] && args+=("-DFLASHQ_CUDA=${FLASHQ_CUDA}")
[ -n "${FLASHQ_CMAKE_ARGS:-}" ] && read -r -a extra <<<"$FLASHQ_CMAKE_ARGS" && args+=("${extra[@]}")

# A build folder configured by another generator (e.g. Makefiles) cannot be reused by Ninja.
if [ "$DRY_RUN" != 1 ] && [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
   ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$BUILD_DIR/CMakeCache.txt"; then
  echo "build: $BUILD_DIR was configured with another generator; reconfiguring from scratch"
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
fi

[ "${1:-}" = "--" ] && shift
if [ "$DRY_RUN" = 1 ]; then
  echo "build: cmake ${args[*]}"
  echo "build: cmake --build $BUILD_DIR -j$JOBS $*"
  exit 0
fi

# Reads ninja's output and shows, per finished step, what it was and about how long the
# rest takes: the steps left at the average rate so far (steps differ in cost, so this is
# a rough guide). On a terminal one line is rewritten; otherwise one line per step. The
# compiler's output of steps that succeed (warnings) goes to a file, that of a failed step
# to the screen.
progress() {
  local start=$SECONDS tty=0 cols=120 failed=0 extra=0 f t what left eta line
  local log="$BUILD_DIR/build-output.log"
  : >"$log"
  [ -t 1 ] && tty=1 && cols=$(tput cols 2>/dev/null || echo 120)
  while IFS= read -r line; do
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]]; then
      f=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]} what=${BASH_REMATCH[3]}
      (( f > 0 )) || continue  # ninja's own checks before the first step
      # "Building CXX object server/CMakeFiles/flashq_server_lib.dir/frontend/x.cc.o" -> "server/frontend/x.cc"
      if [[ $what =~ ^Building\ [A-Z]+\ object\ (.*)CMakeFiles/[^/]+\.dir/(.*)\.o$ ]]; then
        what="compiled ${BASH_REMATCH[1]}${BASH_REMATCH[2]}"
      elif [[ $what =~ ^Linking\ [A-Z]+\ [a-z\ ]+\ (.*)$ ]]; then
        what="linked ${BASH_REMATCH[1]}"
      fi
      eta="estimating the time left"
      if (( f >= 3 && SECONDS - start >= 5 )); then
        left=$(( (SECONDS - start) * (t - f) / f ))
        if (( f == t )); then eta="done"
        elif (( left < 90 )); then eta="about $(( (left + 9) / 10 * 10 )) s left"
        else eta="about $(( (left + 30) / 60 )) min left"; fi
      fi
      line=$(printf 'build: [%d/%d] %3d%%  %s  (%s)' "$f" "$t" $(( 100 * f / t )) "$what" "$eta")
      if (( tty )); then printf '\r\033[K%s' "${line:0:cols-1}"; else printf '%s\n' "$line"; fi
      continue
    fi
    [[ $line == FAILED:* ]] && failed=1
    if (( failed )) || [[ $line == ninja:* ]]; then
      (( tty )) && printf '\r\033[K'
      printf '%s\n' "$line"
    else
      printf '%s\n' "$line" >>"$log"
      extra=$(( extra + 1 ))
    fi
  done
  (( tty )) && printf '\r\033[K'
  (( extra )) && echo "build: the steps printed $extra more lines (compiler warnings): $log"
  echo "build: finished in $(( SECONDS - start )) s"
}

show_progress="${FLASHQ_BUILD_PROGRESS:-0}"

echo "build: cmake ${args[*]}"
cmake "${args[@]}"
echo "build: cmake --build $BUILD_DIR -j$JOBS $*"
if [ "$show_progress" = 1 ]; then
  # Ninja writes "[finished/total] description" once per finished step when not on a terminal.
  NINJA_STATUS='[%f/%t] ' cmake --build "$BUILD_DIR" -j"$JOBS" "$@" 2>&1 | progress
else
  cmake --build "$BUILD_DIR" -j"$JOBS" "$@"
fi
echo "build: done; executables in $BUILD_DIR/bin: $(ls "$BUILD_DIR/bin" 2>/dev/null | tr '\n' ' ')"
