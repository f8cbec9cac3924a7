#!/bin/sh
# Runs the Criterion suite with the arguments given, its output kept in
# LOG as well as shown, and when it fails repeats every failing test's
# name and assertion message as the last lines: two jobs interleave their
# output, and a CI log that keeps only its tail would otherwise show the
# count of failures without their names.  Exits with the suite's status.
#
# usage: LOG=FILE tests/run_suite.sh CP_TESTS [criterion options...]
BIN=${1:?usage: LOG=FILE tests/run_suite.sh CP_TESTS [options...]}
shift
LOG=${LOG:?LOG=FILE: where the suite output is kept}
mkdir -p "$(dirname "$LOG")" || exit 1
rcfile="$LOG.rc"
rm -f "$rcfile"
{
    "$BIN" "$@"
    echo $? > "$rcfile"
} 2>&1 | tee "$LOG"
rc=$(cat "$rcfile" 2>/dev/null || echo 1)
rm -f "$rcfile"
if [ "$rc" -ne 0 ]; then
    echo "---- the failing tests (whole output: $LOG) ----"
    # Criterion's failure lines: "[----] file:line: Assertion Failed", the
    # message lines under it, "[FAIL] suite::test", crashes and timeouts
    grep -E '^\[(----|FAIL|CRASH)\]|[Tt]imed out|CRASH' "$LOG" | grep -v '^\[----\] *$' | tail -n 60
    echo "---- suite exit status $rc ----"
fi
exit "$rc"
