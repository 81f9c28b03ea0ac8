#!/usr/bin/env bash
# The seed's Figure 10: JOBS functions meet at a barrier. JOBS-1 are started asynchronously
# (their client returns at once), the last one waits, and returns once all have arrived.
#
# Usage: examples/shell/gathering.sh [JOBS]   (the server needs --max-workers >= JOBS)
set -euo pipefail
JOBS=${1:-8}
BARRIER=gathering-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')

gathering() {
  seq 1 1 $((JOBS - 1)) | xargs -P 0 -I{} spindle sh --async "barrier -n ${BARRIER} await -p ${JOBS}"
  spindle sh "barrier -n ${BARRIER} await -p ${JOBS}"
}

gathering
