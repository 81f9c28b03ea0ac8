#!/usr/bin/env bash
# The seed's Figure 9: the average size of a web page, computed statelessly. One function per
# archive lists the Content-Length of its pages; awk, on the client, averages them all.
#
# Usage: examples/shell/average.sh CORPUS   (a directory in $SPINDLE_FS made by make_corpus.py)
set -euo pipefail
CORPUS=${1:?usage: average.sh CORPUS}

average() {
  while read -r l; do
    spindle sh "zcat -q '${CORPUS}/${l}' | grep -a ^Content-Length" &
  done < "${CORPUS}/index" | awk '{ sum += $2 } END { if (NR > 0) print int(sum / NR) }'
}

average
