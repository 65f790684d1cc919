#!/usr/bin/env bash
# The long soak (issue 17): the suite's soak program (tests/service/soak.cc: an in-process daemon,
# client threads cycling prefill → decode steps checked against float64 → Release, a racing
# Compact) for as long as asked, with an RSS bound after warm-up.
#   tools/soak/run_long.sh [build dir] [seconds] [RSS growth bound, MiB]
set -euo pipefail
BUILD=${1:-build}
SECONDS_TO_RUN=${2:-3600}
BOUND=${3:-64}
exec "$BUILD/tests/service/soak" --seconds="$SECONDS_TO_RUN" --rss_growth_mib="$BOUND" --clients=4
