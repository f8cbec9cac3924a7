#!/usr/bin/env bash
# make mutation [MUTANTS='glob,glob']: applies each named one-line breakage of
# tests/mutation/*.mut (format: README "Mutation testing") in a scratch git
# worktree -- never in this checkout -- rebuilds incrementally, runs the
# mutant's Criterion filters with the environment of `make test`, restores the
# file, and reports whether the suite killed it.  A mutant whose `find` does
# not occur exactly once, that does not build, or whose filters select no
# test is an ERROR and counts as survived; one that survives while some of
# its tests skipped themselves (no kit, no node package, no CPU feature) is
# SKIPPED, with the first skip's reason, and counts as survived too.  Ends with the line
#   mutation: N killed, M survived
# and exits non-zero when M > 0.
#
# Environment: MUTANTS (globs on names, or on AREA/name where AREA is the .mut
# file's name), JOBS (make and Criterion jobs, 2), MUTANT_TIMEOUT (seconds
# per mutant's tests, 900), MUTATION_DIR (scratch root; default a fresh
# directory under /tmp), CP_SHARED (the kit; default ../shared).
set -u -o pipefail

ROOT=$(git rev-parse --show-toplevel) || exit 2
cd "$ROOT" || exit 2
JOBS=${JOBS:-2}
TIMEOUT=${MUTANT_TIMEOUT:-900}
ONLY=${MUTANTS:-}
SHARED=$(realpath "${CP_SHARED:-$ROOT/../shared}") || { echo "mutation: no kit at ${CP_SHARED:-../shared}" >&2; exit 2; }
# /tmp by default: a worktree under build/ would be found by the Makefile's
# dependency-file scan of build/ on every make in this checkout
SCRATCH=${MUTATION_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/cp-mutation.XXXXXX")}
WT=$SCRATCH/wt
SAVE=$SCRATCH/save
LOGS=$SCRATCH/logs

cleanup() {
    if [ -d "$WT" ]; then git -C "$ROOT" worktree remove --force "$WT" > /dev/null 2>&1 || rm -rf "$WT"; fi
    git -C "$ROOT" worktree prune > /dev/null 2>&1
    [ -n "${MUTATION_DIR:-}" ] || rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'echo "mutation: interrupted" >&2; exit 130' INT TERM

now() { date +%s; }
T_START=$(now)

# ---- the mutants: one record per block, fields separated by \x1f ------------
# name promise file find replace tests where
parse() {
    awk -v RS='' -v ORS='\x1e' '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
    {
        n = split($0, L, "\n"); name = ""; split("", v); keys = 0
        for (i = 1; i <= n; i++) {
            line = L[i]
            if (line ~ /^[ \t]*#/ || line ~ /^[ \t]*$/) continue
            if (line ~ /^\[.*\][ \t]*$/) { name = trim(line); sub(/^\[/, "", name); sub(/\][ \t]*$/, "", name); continue }
            eq = index(line, "=")
            if (!eq) { v["bad"] = v["bad"] " unreadable line: " line; keys++; continue }
            k = trim(substr(line, 1, eq - 1)); v[k] = trim(substr(line, eq + 1)); keys++
        }
        if (name == "" && keys == 0) next
        area = FILENAME; sub(/.*\//, "", area); sub(/\.mut$/, "", area)
        printf "%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s", area, name, v["promise"], v["file"], v["find"], \
            ("replace" in v) ? v["replace"] : "\x01", v["tests"], ("find" in v) ? "" : "no find", v["bad"]
        print ""
    }' "$@"
}

selected() { # area name
    [ -z "$ONLY" ] && return 0
    local g
    IFS=',' read -ra globs <<< "$ONLY"
    for g in "${globs[@]}"; do
        # shellcheck disable=SC2053
        [[ $2 == $g || $1/$2 == $g ]] && return 0
    done
    return 1
}

AREAS=() NAMES=() PROMISES=() FILES=() FINDS=() REPLS=() TESTS=() PROBLEMS=()
shopt -s nullglob
MUTFILES=("$ROOT"/tests/mutation/*.mut)
[ ${#MUTFILES[@]} -gt 0 ] || { echo "mutation: no tests/mutation/*.mut" >&2; exit 2; }
while IFS=$'\x1f' read -r -d $'\x1e' area name promise file find repl tests nofind bad; do
    selected "$area" "$name" || continue
    problem=""
    [ -n "$name" ] || problem="a block without [name]"
    [ -n "$file" ] || problem="$problem no file"
    [ -n "$nofind" ] && problem="$problem no find"
    [ -n "$find" ] || problem="$problem empty find"
    [ "$repl" = $'\x01' ] && problem="$problem no replace"
    [ -n "$tests" ] || problem="$problem no tests"
    [ -n "$bad" ] && problem="$problem$bad"
    AREAS+=("$area") NAMES+=("${name:-?}") PROMISES+=("$promise") FILES+=("$file") FINDS+=("$find") REPLS+=("$repl")
    TESTS+=("$tests") PROBLEMS+=("$problem")
done < <(parse "${MUTFILES[@]}")
N=${#NAMES[@]}
[ "$N" -gt 0 ] || { echo "mutation: no mutant matches MUTANTS='$ONLY'" >&2; exit 2; }

# ---- the scratch worktree: HEAD plus this checkout's uncommitted changes ----
mkdir -p "$SCRATCH" "$SAVE" "$LOGS"
ln -sfn "$SHARED" "$SCRATCH/shared" # ../shared of the worktree
export CP_SHARED=$SHARED
# the NER plugin's npm package is ignored by git, so the scratch worktree has
# none: the real-plugin tests (ner/real_plugin_*) use this checkout's, where
# make deps installed it (they skip without one, and their mutants survive)
if [ -z "${CP_NER_MODULES:-}" ] && [ -f "$ROOT/plugins/ner/node_modules/compromise/package.json" ]; then
    export CP_NER_MODULES=$ROOT/plugins/ner/node_modules
fi
git worktree add --detach -f "$WT" HEAD > "$LOGS/worktree.log" 2>&1 || { cat "$LOGS/worktree.log" >&2; exit 2; }
{ git diff --name-only -z HEAD; git ls-files --others --exclude-standard -z; } | while IFS= read -r -d '' f; do
    if [ -e "$f" ]; then mkdir -p "$WT/$(dirname "$f")" && cp -p "$f" "$WT/$f"; else rm -f "$WT/$f"; fi
done

TARGETS="build/cp_tests build/cacheprune build/gpu_pack build/tests/libcp_test_plugin.so build/tests/cp_test_proc_plugin"
build() { make -C "$WT" -j"$JOBS" $TARGETS > "$1" 2>&1; }
filter_of() { # "a b c" -> one Criterion glob
    local -a g
    read -ra g <<< "$1"
    if [ ${#g[@]} -eq 1 ]; then printf '%s' "${g[0]}"; else local IFS='|'; printf '@(%s)' "${g[*]}"; fi
}
run_tests() { # filter log [--fail-fast] -> exit status of the suite
    rm -rf "$WT/build/tmp"
    (cd "$WT" && CP_BIN=build/cacheprune CP_TMP=build/tmp CP_PLUGINS=build/tests \
        timeout "$TIMEOUT" ./build/cp_tests --jobs "$JOBS" ${3:-} --filter "$1") > "$2" 2>&1
}
tested() { sed -n 's/.*Synthesis: Tested: \([0-9]*\).*/\1/p' "$1" | tail -1; }
# tests that skipped themselves at run time (a missing kit, node package or
# CPU feature): --verbose lists them as [SKIP] with their reason; the tests
# the filter left out read "Test is disabled"
skipped() { grep '^\[SKIP\]' "$1" | grep -vc ': Test is disabled$'; }
skip_reason() { grep '^\[SKIP\]' "$1" | grep -v ': Test is disabled$' | head -1 | sed 's/^\[SKIP\] //'; }

echo "mutation: $N mutants; scratch worktree $WT"
build "$LOGS/build-base.log" || { tail -20 "$LOGS/build-base.log" >&2; echo "mutation: the unmutated tree does not build" >&2; exit 2; }
# the baseline in filters of 40 globs: Criterion's extglob aborts or
# crashes on one @(...) of about 100 alternatives
mapfile -t ALL < <(printf '%s\n' "${TESTS[@]}" | tr ' ' '\n' | grep -v '^$' | sort -u)
BASE_TESTED=0
for ((b = 0; b < ${#ALL[@]}; b += 40)); do
    if ! run_tests "$(filter_of "${ALL[*]:b:40}")" "$LOGS/baseline.log"; then
        tail -30 "$LOGS/baseline.log" >&2
        echo "mutation: the named suites fail without any mutant (log: $LOGS/baseline.log): fix that first" >&2
        exit 2
    fi
    BASE_TESTED=$((BASE_TESTED + $(tested "$LOGS/baseline.log")))
done
echo "mutation: baseline green ($BASE_TESTED tests, $(($(now) - T_START)) s incl. the build)"

KILLED=0 SURVIVED=0
for ((i = 0; i < N; i++)); do
    t0=$(now)
    id="${AREAS[$i]}/${NAMES[$i]}"
    log="$LOGS/$(printf '%s' "$id" | tr '/ ' '__').log"
    f=${FILES[$i]}
    verdict="" why=""
    if [ -n "${PROBLEMS[$i]}" ]; then
        verdict=ERROR why="${PROBLEMS[$i]}"
    elif [ ! -f "$WT/$f" ]; then
        verdict=ERROR why="no file $f"
    else
        count=$(FIND="${FINDS[$i]}" awk 'BEGIN { f = ENVIRON["FIND"]; n = 0 }
            { s = $0; while ((p = index(s, f)) > 0) { n++; s = substr(s, p + length(f)) } } END { print n }' "$WT/$f")
        [ "$count" = 1 ] || verdict=ERROR why="find occurs $count times in $f"
    fi
    if [ -z "$verdict" ]; then
        # keep the file (and its object, for a .c) to restore them as they were
        cp -p "$WT/$f" "$SAVE/src"
        obj="$WT/build/obj/${f%.c}.o"
        have_obj=0
        if [[ $f == *.c && -f $obj ]]; then cp -p "$obj" "$SAVE/obj" && cp -p "${obj%.o}.d" "$SAVE/dep" 2> /dev/null; have_obj=1; fi
        FIND="${FINDS[$i]}" REPL="${REPLS[$i]}" awk 'BEGIN { f = ENVIRON["FIND"]; r = ENVIRON["REPL"] }
            { p = index($0, f); if (p) $0 = substr($0, 1, p - 1) r substr($0, p + length(f)); print }' "$SAVE/src" > "$WT/$f"
        if ! build "$log"; then
            verdict=ERROR why="does not build (log: build/mutation-logs/${log##*/})"
        elif ! run_tests "$(filter_of "${TESTS[$i]}")" "$log" "--fail-fast --verbose"; then # one failure kills it
            verdict=killed
        elif [ "$(skipped "$log")" != 0 ]; then
            # not evidence the suite misses the breakage: the tests that
            # would see it did not run here -- say so, and count it survived
            verdict=SKIPPED why="$(skipped "$log") of its tests skipped ($(skip_reason "$log")); ${PROMISES[$i]}"
        elif [ "$(tested "$log")" = 0 ] || [ -z "$(tested "$log")" ]; then
            verdict=ERROR why="the filters '${TESTS[$i]}' select no test"
        else
            verdict=SURVIVED why="${PROMISES[$i]}"
        fi
        cp -p "$SAVE/src" "$WT/$f"
        if [ "$have_obj" = 1 ]; then
            # the object of the restored source: only the archive and the links redo
            cp -p "$SAVE/obj" "$obj" && touch "$obj"
            [ -f "$SAVE/dep" ] && cp -p "$SAVE/dep" "${obj%.o}.d"
        else
            touch "$WT/$f" # its dependents rebuild
        fi
        rm -f "$SAVE/src" "$SAVE/obj" "$SAVE/dep"
    fi
    dt=$(($(now) - t0))
    case $verdict in
        killed) KILLED=$((KILLED + 1)); printf 'killed    %-44s %4d s\n' "$id" "$dt" ;;
        *) SURVIVED=$((SURVIVED + 1)); printf '%-9s %-44s %4d s  %s\n' "$verdict" "$id" "$dt" "$why" ;;
    esac
done
mkdir -p "$ROOT/build/mutation-logs" && cp "$LOGS"/*.log "$ROOT/build/mutation-logs/" 2> /dev/null
echo "mutation: $N mutants in $(($(now) - T_START)) s (logs: build/mutation-logs/)"
echo "mutation: $KILLED killed, $SURVIVED survived"
[ "$SURVIVED" -eq 0 ]
