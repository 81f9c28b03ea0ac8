#!/usr/bin/env bash
# The seed's section 4.3.4: rank web domains by how often pages link to them. Each function
# counts the domains its archive's links point at, and merges its counts into one treemap
# shared by all of them (a sum per domain, in the server); the client reads the merged
# map and prints the TOP most mentioned domains, most mentioned first.
#
# Usage: examples/shell/domains.sh CORPUS [TOP]
set -euo pipefail
CORPUS=${1:?usage: domains.sh CORPUS [TOP]}
TOP=${2:-10}
TREE=domains-$$
eval "$(spindle shell-env)"   # treemap, counter, ... as commands on the client too

while read -r l; do
  spindle sh "zcat -q '${CORPUS}/${l}' | grep -ao 'href=\"http://[^/\"]*' | cut -d/ -f3 | sort | uniq -c \
    | awk '{ printf \"-1 %s=%s \", \$2, \$1 }' | xargs treemap -n ${TREE} mergeAll -2 sum" &
done < "${CORPUS}/index"
wait
treemap -n "${TREE}" entrySet | awk -F= '{ print $2, $1 }' | LC_ALL=C sort -k1,1nr -k2,2 \
  | sed -n "1,${TOP}p"   # reads to the end: head would leave sort to die of SIGPIPE under pipefail
