#!/usr/bin/env bash
# The long soak (issues 17, 33): the suite's soak program (tests/service/soak.cc: an in-process
# daemon on the cpu backend, client threads cycling prefill → Fork → decode steps through gRPC,
# shared memory and a channel, checked against float64 → Release, remaking their channels and
# regions, a racing Compact) for as long as asked, with an RSS bound after warm-up and a bound on
# the daemon's /dev/shm files at every sample.
#   tools/soak/run_long.sh [build dir] [seconds] [RSS growth bound, MiB]
set -euo pipefail
BUILD=${1:-build}
SECONDS_TO_RUN=${2:-3600}
BOUND=${3:-64}
exec "$BUILD/tests/service/soak" --seconds="$SECONDS_TO_RUN" --rss_growth_mib="$BOUND" --clients=4
