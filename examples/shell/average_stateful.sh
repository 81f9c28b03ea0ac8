#!/usr/bin/env bash
# The seed's Figure 11: the same average, computed statefully. Each function averages the
# pages of its archive and adds that to a shared counter; the client divides the total.
#
# Usage: examples/shell/average_stateful.sh CORPUS
set -euo pipefail
CORPUS=${1:?usage: average_stateful.sh CORPUS}
COUNTER=average-$$

average_stateful() {
  spindle sh "counter -n ${COUNTER} reset"
  while read -r l; do
    spindle sh "counter -n ${COUNTER} increment -i \$(zcat -q '${CORPUS}/${l}' | grep -a ^Content-Length \
      | awk '{ sum += \$2 } END { if (NR > 0) print int(sum / NR) }')" 1> /dev/null &
  done < "${CORPUS}/index"
  wait
  lines=$(wc -l < "${CORPUS}/index")
  total_average=$(spindle sh "counter -n ${COUNTER} tally")
  echo $((total_average / lines))
}

average_stateful
